//! Struct member offsets from the kernel's BTF (/sys/kernel/btf/vmlinux).
//! rustc emits no CO-RE relocations, so probes that read kernel structs get
//! their offsets from here, computed at load time and passed in as globals.
//! Only what that needs is parsed: type kinds, names and struct members.

use std::collections::HashMap;

use anyhow::{Context as _, Result, anyhow, bail};
use probes_common::offsets::MemberOffset;

const MAGIC: u16 = 0xeb9f;
const KIND_STRUCT: u32 = 4;
const KIND_UNION: u32 = 5;
const KIND_FUNC: u32 = 12;
const KIND_FUNC_PROTO: u32 = 13;

#[derive(Clone, Debug)]
struct Member {
    name: String,
    type_id: u32,
    bit_offset: u32,
    /// Where in the BTF blob the member's offset is stored.
    offset_at: usize,
}

#[derive(Clone, Debug)]
struct Type {
    kind: u32,
    name: String,
    /// The referenced type for typedefs, pointers and qualifiers (the size
    /// for structs).
    size_or_type: u32,
    /// Struct and union members; empty for other kinds.
    members: Vec<Member>,
    /// Members, enumerators or (for function prototypes) parameters.
    vlen: u32,
}

pub struct KernelBtf {
    /// Indexed by type id (id 0 is void).
    types: Vec<Type>,
    structs: HashMap<String, u32>,
}

fn u32_at(data: &[u8], at: usize) -> Result<u32> {
    let bytes = data
        .get(at..at + 4)
        .ok_or_else(|| anyhow!("BTF truncated at byte {at}"))?;
    Ok(u32::from_le_bytes(bytes.try_into().expect("four bytes")))
}

fn string_at(strings: &[u8], offset: u32) -> Result<String> {
    let start = offset as usize;
    let rest = strings
        .get(start..)
        .ok_or_else(|| anyhow!("BTF string offset {offset} out of range"))?;
    let end = rest.iter().position(|&b| b == 0).unwrap_or(rest.len());
    Ok(String::from_utf8_lossy(&rest[..end]).into_owned())
}

impl KernelBtf {
    pub fn from_file(path: &std::path::Path) -> Result<Self> {
        let data = std::fs::read(path).with_context(|| format!("reading {}", path.display()))?;
        Self::parse(&data).with_context(|| format!("parsing {}", path.display()))
    }

    /// Parses little-endian BTF (the kernel's, on the machines we run on).
    pub fn parse(data: &[u8]) -> Result<Self> {
        let magic = u16::from_le_bytes(
            data.get(..2)
                .ok_or_else(|| anyhow!("empty BTF"))?
                .try_into()?,
        );
        if magic != MAGIC {
            bail!("not little-endian BTF (magic {magic:#x})");
        }
        let hdr_len = u32_at(data, 4)? as usize;
        let (type_off, type_len) = (u32_at(data, 8)? as usize, u32_at(data, 12)? as usize);
        let (str_off, str_len) = (u32_at(data, 16)? as usize, u32_at(data, 20)? as usize);
        let types_data = data
            .get(hdr_len + type_off..hdr_len + type_off + type_len)
            .ok_or_else(|| anyhow!("BTF type section out of range"))?;
        let strings = data
            .get(hdr_len + str_off..hdr_len + str_off + str_len)
            .ok_or_else(|| anyhow!("BTF string section out of range"))?;

        let mut types = vec![Type {
            kind: 0,
            name: String::new(),
            size_or_type: 0,
            members: Vec::new(),
            vlen: 0,
        }];
        let mut at = 0;
        while at < types_data.len() {
            let name_off = u32_at(types_data, at)?;
            let info = u32_at(types_data, at + 4)?;
            let kind = (info >> 24) & 0x1f;
            let vlen = (info & 0xffff) as usize;
            let kind_flag = info >> 31 == 1;
            let size_or_type = u32_at(types_data, at + 8)?;
            at += 12;
            let mut members = Vec::new();
            let extra = match kind {
                1 => 4,  // INT
                3 => 12, // ARRAY
                KIND_STRUCT | KIND_UNION => {
                    for i in 0..vlen {
                        let m = at + i * 12;
                        let offset = u32_at(types_data, m + 8)?;
                        members.push(Member {
                            name: string_at(strings, u32_at(types_data, m)?)?,
                            type_id: u32_at(types_data, m + 4)?,
                            offset_at: hdr_len + type_off + m + 8,
                            // With kind_flag the top 8 bits hold a bitfield size.
                            bit_offset: if kind_flag {
                                offset & 0x00ff_ffff
                            } else {
                                offset
                            },
                        });
                    }
                    vlen * 12
                }
                6 => vlen * 8, // ENUM
                KIND_FUNC_PROTO => vlen * 8,
                14 => 4,                               // VAR
                15 => vlen * 12,                       // DATASEC
                17 => 4,                               // DECL_TAG
                19 => vlen * 12,                       // ENUM64
                2 | 7..=11 | KIND_FUNC | 16 | 18 => 0, // PTR FWD TYPEDEF VOLATILE CONST RESTRICT FUNC FLOAT TYPE_TAG
                other => bail!("unknown BTF kind {other}"),
            };
            at += extra;
            types.push(Type {
                kind,
                name: string_at(strings, name_off)?,
                size_or_type,
                members,
                vlen: vlen as u32,
            });
        }
        let structs = types
            .iter()
            .enumerate()
            .filter(|(_, t)| t.kind == KIND_STRUCT && !t.name.is_empty())
            .map(|(id, t)| (t.name.clone(), id as u32))
            .collect();
        Ok(Self { types, structs })
    }

    /// How many parameters the kernel function `name` takes (signatures
    /// change between kernels: `inet_csk_accept` lost two in 6.10).
    pub fn func_param_count(&self, name: &str) -> Result<u32> {
        let func = self
            .types
            .iter()
            .find(|t| t.kind == KIND_FUNC && t.name == name)
            .ok_or_else(|| anyhow!("the kernel's BTF has no function {name}"))?;
        let proto = self
            .types
            .get(func.size_or_type as usize)
            .filter(|t| t.kind == KIND_FUNC_PROTO)
            .ok_or_else(|| anyhow!("function {name} has no prototype in the kernel's BTF"))?;
        Ok(proto.vlen)
    }

    /// Where in the BTF blob the offset of `struct name`'s direct member
    /// `member` is stored (tests patch it to prove a wrong offset is caught).
    pub fn member_offset_position(&self, name: &str, member: &str) -> Option<usize> {
        let id = *self.structs.get(name)?;
        self.types[id as usize]
            .members
            .iter()
            .find(|m| m.name == member)
            .map(|m| m.offset_at)
    }

    /// Byte offset of `member` in `struct name`, looking through anonymous
    /// unions and structs (`sock.__sk_common` holds `skc_*` inside some).
    pub fn member_offset(&self, name: &str, member: &str) -> Result<u32> {
        let id = *self
            .structs
            .get(name)
            .ok_or_else(|| anyhow!("the kernel's BTF has no struct {name}"))?;
        let bits = self
            .find(id, member)
            .ok_or_else(|| anyhow!("struct {name} has no member {member} in the kernel's BTF"))?;
        if bits % 8 != 0 {
            bail!("{name}.{member} is a bitfield");
        }
        Ok(bits / 8)
    }

    /// `path` like `["sock", "__sk_common", "skc_state"]`: the offset of a
    /// member of a member.
    pub fn path_offset(&self, name: &str, path: &[&str]) -> Result<u32> {
        let mut id = *self
            .structs
            .get(name)
            .ok_or_else(|| anyhow!("the kernel's BTF has no struct {name}"))?;
        let mut bits = 0;
        for (i, member) in path.iter().enumerate() {
            let (off, type_id) = self.find_with_type(id, member).ok_or_else(|| {
                anyhow!(
                    "{name}.{} not found in the kernel's BTF",
                    path[..=i].join(".")
                )
            })?;
            bits += off;
            id = self.skip_modifiers(type_id);
        }
        if bits % 8 != 0 {
            bail!("{name}.{} is a bitfield", path.join("."));
        }
        Ok(bits / 8)
    }

    /// Each global of `table` with the offset of its member on this kernel.
    pub fn offsets(&self, table: &[MemberOffset]) -> Result<Vec<(&'static str, u32)>> {
        table
            .iter()
            .map(|m| Ok((m.global, self.path_offset(m.btf_struct, m.path)?)))
            .collect()
    }

    fn find(&self, id: u32, member: &str) -> Option<u32> {
        self.find_with_type(id, member).map(|(bits, _)| bits)
    }

    fn find_with_type(&self, id: u32, member: &str) -> Option<(u32, u32)> {
        let t = self.types.get(id as usize)?;
        for m in &t.members {
            if m.name == member {
                return Some((m.bit_offset, m.type_id));
            }
            if m.name.is_empty() {
                let inner = self.skip_modifiers(m.type_id);
                if let Some((bits, ty)) = self.find_with_type(inner, member) {
                    return Some((m.bit_offset + bits, ty));
                }
            }
        }
        None
    }

    /// Follows typedefs and qualifiers to the underlying struct or union.
    fn skip_modifiers(&self, mut id: u32) -> u32 {
        for _ in 0..16 {
            match self.types.get(id as usize) {
                // TYPEDEF VOLATILE CONST RESTRICT TYPE_TAG
                Some(t) if matches!(t.kind, 8..=11 | 18) => id = t.size_or_type,
                _ => break,
            }
        }
        id
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A tiny BTF blob: `struct outer { int a; union { int b; int c; }; struct inner d; }`
    /// with `struct inner { int x; int y; }`, offsets in bits as BTF stores them.
    fn blob() -> Vec<u8> {
        let strings = b"\0int\0outer\0a\0b\0c\0d\0inner\0x\0y\0";
        let s = |name: &str| {
            let needle = format!("\0{name}\0");
            strings
                .windows(needle.len())
                .position(|w| w == needle.as_bytes())
                .unwrap() as u32
                + 1
        };
        let mut types = Vec::new();
        let mut push = |words: &[u32]| {
            words
                .iter()
                .for_each(|w| types.extend_from_slice(&w.to_le_bytes()))
        };
        // 1: int (4 bytes)
        push(&[s("int"), 1 << 24, 4, 32]);
        // 2: anonymous union { b; c; }
        push(&[0, (5 << 24) | 2, 4, s("b"), 1, 0, s("c"), 1, 0]);
        // 3: struct inner { x @0; y @32; }
        push(&[s("inner"), (4 << 24) | 2, 8, s("x"), 1, 0, s("y"), 1, 32]);
        // 4: typedef inner_t = 3
        push(&[0, 8 << 24, 3]);
        // 5: struct outer { a @0; <anon> @32; d @64 (via the typedef) }
        push(&[
            s("outer"),
            (4 << 24) | 3,
            16,
            s("a"),
            1,
            0,
            0,
            2,
            32,
            s("d"),
            4,
            64,
        ]);
        let mut data = Vec::new();
        data.extend_from_slice(&MAGIC.to_le_bytes());
        data.extend_from_slice(&[1, 0]);
        for w in [
            24u32,
            0,
            types.len() as u32,
            types.len() as u32,
            strings.len() as u32,
        ] {
            data.extend_from_slice(&w.to_le_bytes());
        }
        data.extend_from_slice(&types);
        data.extend_from_slice(strings);
        data
    }

    #[test]
    fn finds_members_through_anonymous_unions_and_typedefs() {
        let btf = KernelBtf::parse(&blob()).unwrap();
        assert_eq!(btf.member_offset("outer", "a").unwrap(), 0);
        assert_eq!(btf.member_offset("outer", "c").unwrap(), 4);
        assert_eq!(btf.member_offset("outer", "d").unwrap(), 8);
        assert_eq!(btf.path_offset("outer", &["d", "y"]).unwrap(), 12);
        assert!(btf.member_offset("outer", "nope").is_err());
        assert!(btf.member_offset("nope", "a").is_err());
    }

    #[test]
    fn a_patched_member_offset_reads_back_patched() {
        let mut data = blob();
        let btf = KernelBtf::parse(&data).unwrap();
        let at = btf.member_offset_position("outer", "d").unwrap();
        data[at..at + 4].copy_from_slice(&(16u32 * 8).to_le_bytes());
        let patched = KernelBtf::parse(&data).unwrap();
        assert_eq!(patched.member_offset("outer", "d").unwrap(), 16);
        assert_eq!(patched.member_offset("outer", "a").unwrap(), 0);
        assert!(btf.member_offset_position("outer", "nope").is_none());
    }

    #[test]
    fn rejects_what_is_not_btf() {
        assert!(KernelBtf::parse(b"").is_err());
        assert!(KernelBtf::parse(&[0u8; 32]).is_err());
        let mut truncated = blob();
        truncated.truncate(40);
        assert!(KernelBtf::parse(&truncated).is_err());
    }

    #[test]
    fn reads_this_kernels_socket_layout() {
        // The running kernel's BTF is world-readable: no root needed.
        let path = std::path::Path::new("/sys/kernel/btf/vmlinux");
        if !path.exists() {
            panic!("this test needs a kernel with BTF, as stackprobe does");
        }
        let btf = KernelBtf::from_file(path).unwrap();
        // sock_common starts struct sock; skc_family is a u16 in its first 24 bytes.
        assert_eq!(btf.member_offset("sock", "__sk_common").unwrap(), 0);
        let family = btf
            .path_offset("sock", &["__sk_common", "skc_family"])
            .unwrap();
        assert!(family < 24, "{family}");
        assert!(btf.member_offset("task_struct", "files").is_ok());
        let accept_args = btf.func_param_count("inet_csk_accept").unwrap();
        assert!([2, 4].contains(&accept_args), "{accept_args}");
        assert!(btf.func_param_count("no_such_function").is_err());
        assert!(btf.member_offset("file", "private_data").is_ok());
        // Every member the probes read is on this kernel.
        let iter = btf.offsets(probes_common::sock::ITER_MEMBERS).unwrap();
        assert_eq!(iter.len(), probes_common::sock::ITER_MEMBERS.len());
        assert_eq!(iter[4], ("SKC_FAMILY", family));
        let walk = btf.offsets(probes_common::accept::FD_WALK_MEMBERS).unwrap();
        assert_eq!(
            walk[0],
            (
                "TASK_FILES",
                btf.member_offset("task_struct", "files").unwrap()
            )
        );
        assert!(
            btf.offsets(probes_common::fork::KERNEL_CLONE_MEMBERS)
                .is_ok()
        );
    }

    #[test]
    fn a_table_entry_the_kernel_lacks_is_an_error() {
        let btf = KernelBtf::parse(&blob()).unwrap();
        let table = probes_common::member_table!(D_Y: outer.d.y, C: outer.c);
        assert_eq!(btf.offsets(&table).unwrap(), [("D_Y", 12), ("C", 4)]);
        let missing = probes_common::member_table!(A: outer.a, NOPE: outer.nope);
        assert!(btf.offsets(&missing).is_err());
    }
}
