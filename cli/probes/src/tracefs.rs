//! Tracepoint record layouts, read from tracefs `format` files at run time:
//! they differ between kernels (6.18 moved `sched_process_fork.child_pid`).

use std::{
    ffi::CString,
    fs,
    path::{Path, PathBuf},
};

use anyhow::{Context as _, Result, anyhow, bail};

const CANDIDATES: [&str; 2] = ["/sys/kernel/tracing", "/sys/kernel/debug/tracing"];

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Field {
    pub name: String,
    pub offset: u32,
    pub size: u32,
    pub signed: bool,
}

/// Parses the `field:` lines of a tracefs `format` file.
pub fn parse_format(text: &str) -> Result<Vec<Field>> {
    let mut fields = Vec::new();
    for line in text
        .lines()
        .map(str::trim)
        .filter(|l| l.starts_with("field:"))
    {
        let mut decl = None;
        let (mut offset, mut size, mut signed) = (None, None, None);
        for part in line.split(';').map(str::trim).filter(|p| !p.is_empty()) {
            let (key, value) = part
                .split_once(':')
                .ok_or_else(|| anyhow!("malformed format line {line:?}"))?;
            match key {
                "field" => decl = Some(value),
                "offset" => offset = Some(value.parse::<u32>()?),
                "size" => size = Some(value.parse::<u32>()?),
                "signed" => signed = Some(value == "1"),
                _ => {}
            }
        }
        let (Some(decl), Some(offset), Some(size)) = (decl, offset, size) else {
            bail!("format line {line:?} lacks a field, offset or size");
        };
        // "int fd", "char comm[16]", "__data_loc char[] filename"
        let name = decl
            .split_whitespace()
            .last()
            .map(|n| n.split('[').next().unwrap_or(n))
            .filter(|n| !n.is_empty())
            .ok_or_else(|| anyhow!("format line {line:?} names no field"))?;
        fields.push(Field {
            name: name.to_string(),
            offset,
            size,
            signed: signed.unwrap_or(false),
        });
    }
    Ok(fields)
}

/// The tracefs mount. If stackprobe had to mount it, dropping this unmounts it
/// again, leaving the system as it was.
#[derive(Debug)]
pub struct Tracefs {
    root: PathBuf,
    mounted_by_us: bool,
}

impl Tracefs {
    pub fn open_or_mount() -> Result<Self> {
        if let Some(root) = CANDIDATES
            .iter()
            .map(Path::new)
            .find(|p| p.join("events").is_dir())
        {
            return Ok(Self {
                root: root.to_path_buf(),
                mounted_by_us: false,
            });
        }
        let root = Path::new(CANDIDATES[0]);
        let target = CString::new(CANDIDATES[0]).expect("no NUL in a constant");
        // SAFETY: all pointers are valid NUL-terminated strings for the call.
        let rc = unsafe {
            libc::mount(
                c"tracefs".as_ptr(),
                target.as_ptr(),
                c"tracefs".as_ptr(),
                0,
                std::ptr::null(),
            )
        };
        if rc != 0 || !root.join("events").is_dir() {
            bail!(
                "tracefs is not mounted and mounting it at {} failed ({}); \
                 mount it with: mount -t tracefs tracefs {}",
                root.display(),
                std::io::Error::last_os_error(),
                root.display()
            );
        }
        Ok(Self {
            root: root.to_path_buf(),
            mounted_by_us: true,
        })
    }

    pub fn has_event(&self, category: &str, event: &str) -> bool {
        self.root.join("events").join(category).join(event).is_dir()
    }

    pub fn fields(&self, category: &str, event: &str) -> Result<Vec<Field>> {
        let path = self
            .root
            .join("events")
            .join(category)
            .join(event)
            .join("format");
        let text = fs::read_to_string(&path).with_context(|| {
            format!(
                "this kernel has no tracepoint {category}/{event} ({} unreadable)",
                path.display()
            )
        })?;
        parse_format(&text).with_context(|| format!("parsing {}", path.display()))
    }

    pub fn field(&self, category: &str, event: &str, name: &str) -> Result<Field> {
        self.fields(category, event)?
            .into_iter()
            .find(|f| f.name == name)
            .ok_or_else(|| {
                anyhow!("tracepoint {category}/{event} has no field {name:?} on this kernel")
            })
    }

    /// The offset of `name`, checked to be the size the probe reads.
    pub fn offset(&self, category: &str, event: &str, name: &str, size: u32) -> Result<u32> {
        let field = self.field(category, event, name)?;
        if field.size != size {
            bail!(
                "tracepoint {category}/{event} field {name} is {} bytes on this kernel, the probe reads {size}",
                field.size
            );
        }
        Ok(field.offset)
    }

    /// The offset of `name` in each of `events`, which must agree (one
    /// program reads them all).
    pub fn same_offset(
        &self,
        category: &str,
        events: &[&str],
        name: &str,
        size: u32,
    ) -> Result<u32> {
        let offsets = events
            .iter()
            .map(|e| self.offset(category, e, name, size))
            .collect::<Result<Vec<_>>>()?;
        if offsets.windows(2).any(|w| w[0] != w[1]) {
            bail!("{events:?} put {name} at different offsets ({offsets:?}) on this kernel");
        }
        offsets
            .first()
            .copied()
            .ok_or_else(|| anyhow!("no tracepoints named"))
    }
}

impl Drop for Tracefs {
    fn drop(&mut self) {
        if self.mounted_by_us
            && let Ok(target) = CString::new(self.root.as_os_str().as_encoded_bytes())
        {
            // SAFETY: target is a valid NUL-terminated path.
            unsafe { libc::umount2(target.as_ptr(), libc::MNT_DETACH) };
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const FORK_6_18: &str = "name: sched_process_fork
ID: 366
format:
\tfield:unsigned short common_type;\toffset:0;\tsize:2;\tsigned:0;
\tfield:unsigned char common_flags;\toffset:2;\tsize:1;\tsigned:0;
\tfield:unsigned char common_preempt_count;\toffset:3;\tsize:1;\tsigned:0;
\tfield:int common_pid;\toffset:4;\tsize:4;\tsigned:1;

\tfield:__data_loc char[] parent_comm;\toffset:8;\tsize:4;\tsigned:0;
\tfield:pid_t parent_pid;\toffset:12;\tsize:4;\tsigned:1;
\tfield:__data_loc char[] child_comm;\toffset:16;\tsize:4;\tsigned:0;
\tfield:pid_t child_pid;\toffset:20;\tsize:4;\tsigned:1;

print fmt: \"comm=%s pid=%d child_comm=%s child_pid=%d\", __get_str(parent_comm), REC->parent_pid, __get_str(child_comm), REC->child_pid
";

    const FORK_6_1: &str = "format:
\tfield:unsigned short common_type;\toffset:0;\tsize:2;\tsigned:0;
\tfield:char parent_comm[16];\toffset:8;\tsize:16;\tsigned:1;
\tfield:pid_t parent_pid;\toffset:24;\tsize:4;\tsigned:1;
\tfield:char child_comm[16];\toffset:28;\tsize:16;\tsigned:1;
\tfield:pid_t child_pid;\toffset:44;\tsize:4;\tsigned:1;
";

    fn find<'a>(fields: &'a [Field], name: &str) -> &'a Field {
        fields.iter().find(|f| f.name == name).unwrap()
    }

    #[test]
    fn child_pid_moved_between_kernels() {
        let new = parse_format(FORK_6_18).unwrap();
        let old = parse_format(FORK_6_1).unwrap();
        assert_eq!(find(&new, "child_pid").offset, 20);
        assert_eq!(find(&old, "child_pid").offset, 44);
        assert_eq!(find(&old, "child_comm").size, 16);
        assert_eq!(find(&new, "child_comm").size, 4);
        assert!(find(&new, "child_pid").signed);
        assert_eq!(new.len(), 8);
    }

    #[test]
    fn syscall_exit_ret() {
        let text = "\tfield:int __syscall_nr;\toffset:8;\tsize:4;\tsigned:1;\n\tfield:long ret;\toffset:16;\tsize:8;\tsigned:1;\n";
        let f = parse_format(text).unwrap();
        assert_eq!(
            f[1],
            Field {
                name: "ret".into(),
                offset: 16,
                size: 8,
                signed: true
            }
        );
    }

    #[test]
    fn malformed_lines_are_errors() {
        assert!(parse_format("\tfield:int x;\toffset:zz;\tsize:4;\n").is_err());
        assert!(parse_format("\tfield:int x;\tsize:4;\n").is_err());
    }
}
