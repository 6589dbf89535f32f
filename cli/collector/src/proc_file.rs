//! /proc files read at every report, opened once and read again from the
//! start each time (pread at 0 makes the kernel generate them anew): an
//! open and a close per read cost more than the read of most of them, and
//! a seq_file opened anew starts with a page of buffer, so one longer than
//! a page (/proc/net/netstat) was generated twice per read. Each is read
//! whole into a buffer kept between reads.

use std::{fs::File, io, os::unix::fs::FileExt as _};

pub struct ProcFile {
    path: &'static str,
    /// Opened at the first read, and again after a failed one.
    file: Option<File>,
    buf: Vec<u8>,
}

impl ProcFile {
    pub fn new(path: &'static str) -> Self {
        Self {
            path,
            file: None,
            buf: Vec::new(),
        }
    }

    /// The file's text now; None if it cannot be opened or read, or is not
    /// UTF-8 (as `fs::read_to_string`).
    pub fn read(&mut self) -> Option<&str> {
        if self.file.is_none() {
            self.file = File::open(self.path).ok();
        }
        let file = self.file.as_ref()?;
        let mut len = 0;
        loop {
            if len == self.buf.len() {
                self.buf.resize((2 * len).max(8192), 0);
            }
            match file.read_at(&mut self.buf[len..], len as u64) {
                Ok(0) => break,
                Ok(n) => len += n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(_) => {
                    self.file = None;
                    return None;
                }
            }
        }
        std::str::from_utf8(&self.buf[..len]).ok()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_read_is_the_whole_file_now() {
        let path =
            std::env::temp_dir().join(format!("stackprobe-proc-file-{}", std::process::id()));
        let long = "x".repeat(20_000);
        std::fs::write(&path, &long).unwrap();
        let leaked: &'static str = Box::leak(path.to_str().unwrap().to_string().into_boxed_str());
        let mut f = ProcFile::new(leaked);
        assert_eq!(f.read(), Some(long.as_str()));
        // Shorter now, written in place: the read ends where the file does.
        std::fs::OpenOptions::new()
            .write(true)
            .truncate(true)
            .open(&path)
            .unwrap()
            .write_all_at(b"short", 0)
            .unwrap();
        assert_eq!(f.read(), Some("short"));
        std::fs::remove_file(&path).unwrap();
        // The file is still open: its last text.
        assert_eq!(f.read(), Some("short"));
        assert_eq!(ProcFile::new("/nonexistent/stackprobe").read(), None);
    }

    #[test]
    fn proc_files_read_as_read_to_string_reads_them() {
        // Files that do not change between two reads.
        for path in [
            "/proc/sys/net/ipv4/ip_local_port_range",
            "/proc/self/cmdline",
        ] {
            let mut f = ProcFile::new(path);
            let want = std::fs::read_to_string(path).unwrap();
            assert_eq!(f.read(), Some(want.as_str()), "{path}");
            assert_eq!(f.read(), Some(want.as_str()), "{path}, read again");
        }
        // Longer than a page, and its lines the same.
        let mut f = ProcFile::new("/proc/net/netstat");
        let want = std::fs::read_to_string("/proc/net/netstat").unwrap();
        let got = f.read().unwrap().to_string();
        assert_eq!(got.len() > 4096, want.len() > 4096);
        let heads = |t: &str| {
            t.lines()
                .map(|l| l.split(' ').next().unwrap().to_string())
                .collect::<Vec<_>>()
        };
        assert_eq!(heads(&got), heads(&want));
    }
}
