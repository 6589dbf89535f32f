//! Struct member offsets from the kernel's BTF (/sys/kernel/btf/vmlinux).
//! rustc emits no CO-RE relocations, so probes that read kernel structs get
//! their offsets from here, computed at load time and passed in as globals.
//! Only what that needs is read: type kinds, names and struct members. The
//! blob is kept as it is with an index of where each type starts, and names
//! are compared in place: building a name per type (over 100 000 of them)
//! cost more memory and time than the rest of the load.

use anyhow::{Context as _, Result, anyhow, bail};
use probes_common::offsets::MemberOffset;

const MAGIC: u16 = 0xeb9f;
const KIND_ENUM: u32 = 6;
const KIND_STRUCT: u32 = 4;
const KIND_UNION: u32 = 5;
const KIND_FUNC: u32 = 12;
const KIND_FUNC_PROTO: u32 = 13;
/// name_off, info, size_or_type.
const TYPE_HEADER: usize = 12;
/// name_off, type, offset.
const MEMBER_LEN: usize = 12;

#[derive(Clone, Copy, Debug)]
struct Member<'a> {
    name: &'a [u8],
    type_id: u32,
    bit_offset: u32,
    /// Where in the BTF blob the member's offset is stored.
    #[cfg(any(test, feature = "test-support"))]
    offset_at: usize,
}

pub struct KernelBtf {
    data: Vec<u8>,
    /// Where the type and string sections start in `data`.
    types_at: usize,
    strings: std::ops::Range<usize>,
    /// Where each type's record starts in the type section, indexed by type
    /// id (id 0 is void and has none).
    type_at: Vec<u32>,
    /// Named structs' ids, sorted by name.
    structs: Vec<u32>,
}

fn u32_at(data: &[u8], at: usize) -> Result<u32> {
    let bytes = data
        .get(at..at + 4)
        .ok_or_else(|| anyhow!("BTF truncated at byte {at}"))?;
    Ok(u32::from_le_bytes(bytes.try_into().expect("four bytes")))
}

impl KernelBtf {
    pub fn from_file(path: &std::path::Path) -> Result<Self> {
        let data = std::fs::read(path).with_context(|| format!("reading {}", path.display()))?;
        Self::from_bytes(data).with_context(|| format!("parsing {}", path.display()))
    }

    /// Parses little-endian BTF (the kernel's, on the machines we run on).
    pub fn parse(data: &[u8]) -> Result<Self> {
        Self::from_bytes(data.to_vec())
    }

    fn from_bytes(data: Vec<u8>) -> Result<Self> {
        let magic = u16::from_le_bytes(
            data.get(..2)
                .ok_or_else(|| anyhow!("empty BTF"))?
                .try_into()?,
        );
        if magic != MAGIC {
            bail!("not little-endian BTF (magic {magic:#x})");
        }
        let hdr_len = u32_at(&data, 4)? as usize;
        let (type_off, type_len) = (u32_at(&data, 8)? as usize, u32_at(&data, 12)? as usize);
        let (str_off, str_len) = (u32_at(&data, 16)? as usize, u32_at(&data, 20)? as usize);
        let types_at = hdr_len + type_off;
        let strings = hdr_len + str_off..hdr_len + str_off + str_len;
        if data.get(types_at..types_at + type_len).is_none() {
            bail!("BTF type section out of range");
        }
        if data.get(strings.clone()).is_none() {
            bail!("BTF string section out of range");
        }
        let types_data = &data[types_at..types_at + type_len];
        let name_in_range = |at: usize| -> Result<()> {
            let offset = u32_at(types_data, at)?;
            if offset as usize > str_len {
                bail!("BTF string offset {offset} out of range");
            }
            Ok(())
        };

        let mut type_at = vec![0];
        let mut structs = Vec::new();
        let mut at = 0;
        while at < types_data.len() {
            name_in_range(at)?;
            let info = u32_at(types_data, at + 4)?;
            let kind = (info >> 24) & 0x1f;
            let vlen = (info & 0xffff) as usize;
            let extra = match kind {
                1 => 4,  // INT
                3 => 12, // ARRAY
                KIND_STRUCT | KIND_UNION => {
                    for i in 0..vlen {
                        name_in_range(at + TYPE_HEADER + i * MEMBER_LEN)?;
                    }
                    vlen * MEMBER_LEN
                }
                KIND_ENUM => vlen * 8,
                KIND_FUNC_PROTO => vlen * 8,
                14 => 4,                               // VAR
                15 => vlen * 12,                       // DATASEC
                17 => 4,                               // DECL_TAG
                19 => vlen * 12,                       // ENUM64
                2 | 7..=11 | KIND_FUNC | 16 | 18 => 0, // PTR FWD TYPEDEF VOLATILE CONST RESTRICT FUNC FLOAT TYPE_TAG
                other => bail!("unknown BTF kind {other}"),
            };
            if at + TYPE_HEADER + extra > types_data.len() {
                bail!("BTF truncated at byte {}", types_at + at);
            }
            if kind == KIND_STRUCT && u32_at(types_data, at)? != 0 {
                structs.push(type_at.len() as u32);
            }
            type_at.push(at as u32);
            at += TYPE_HEADER + extra;
        }
        let mut btf = Self {
            data,
            types_at,
            strings,
            type_at,
            structs: Vec::new(),
        };
        // Stable, so that of two structs of one name the later wins, as it
        // always has.
        structs.sort_by(|&a, &b| btf.name(a).cmp(btf.name(b)));
        btf.structs = structs;
        Ok(btf)
    }

    /// The word `index` of type `id`'s record (0: name, 1: info, 2: size or
    /// type; members and parameters follow).
    fn word(&self, id: u32, index: usize) -> u32 {
        let at = self.types_at + self.type_at[id as usize] as usize + index * 4;
        u32::from_le_bytes(self.data[at..at + 4].try_into().expect("four bytes"))
    }

    fn string(&self, offset: u32) -> &[u8] {
        let rest = &self.data[self.strings.start + offset as usize..self.strings.end];
        let end = rest.iter().position(|&b| b == 0).unwrap_or(rest.len());
        &rest[..end]
    }

    fn exists(&self, id: u32) -> bool {
        id != 0 && (id as usize) < self.type_at.len()
    }

    fn kind(&self, id: u32) -> u32 {
        if self.exists(id) {
            (self.word(id, 1) >> 24) & 0x1f
        } else {
            0
        }
    }

    fn vlen(&self, id: u32) -> u32 {
        self.word(id, 1) & 0xffff
    }

    fn name(&self, id: u32) -> &[u8] {
        self.string(self.word(id, 0))
    }

    /// The referenced type for typedefs, pointers and qualifiers (the size
    /// for structs).
    fn size_or_type(&self, id: u32) -> u32 {
        self.word(id, 2)
    }

    /// Struct and union members; none for other kinds.
    fn members(&self, id: u32) -> impl Iterator<Item = Member<'_>> {
        let kind = self.kind(id);
        let count = if matches!(kind, KIND_STRUCT | KIND_UNION) {
            self.vlen(id) as usize
        } else {
            0
        };
        // With kind_flag the top 8 bits of an offset hold a bitfield size.
        let bitfields = count > 0 && self.word(id, 1) >> 31 == 1;
        (0..count).map(move |i| {
            let word = 3 + i * 3;
            let offset = self.word(id, word + 2);
            Member {
                name: self.string(self.word(id, word)),
                type_id: self.word(id, word + 1),
                bit_offset: if bitfields {
                    offset & 0x00ff_ffff
                } else {
                    offset
                },
                #[cfg(any(test, feature = "test-support"))]
                offset_at: self.types_at + self.type_at[id as usize] as usize + (word + 2) * 4,
            }
        })
    }

    fn struct_id(&self, name: &str) -> Option<u32> {
        let after = self
            .structs
            .partition_point(|&id| self.name(id) <= name.as_bytes());
        let id = *self.structs.get(after.checked_sub(1)?)?;
        (self.name(id) == name.as_bytes()).then_some(id)
    }

    /// How many parameters the kernel function `name` takes (signatures
    /// change between kernels: `inet_csk_accept` lost two in 6.10).
    pub fn func_param_count(&self, name: &str) -> Result<u32> {
        let func = (1..self.type_at.len() as u32)
            .find(|&id| self.kind(id) == KIND_FUNC && self.name(id) == name.as_bytes())
            .ok_or_else(|| anyhow!("the kernel's BTF has no function {name}"))?;
        let proto = self.size_or_type(func);
        if self.kind(proto) != KIND_FUNC_PROTO {
            bail!("function {name} has no prototype in the kernel's BTF");
        }
        Ok(self.vlen(proto))
    }

    /// Whether some enum of the kernel's BTF has a value named `name`: the
    /// kernel's `enum bpf_func_id` names every helper it has.
    pub fn has_enum_value(&self, name: &str) -> bool {
        (1..self.type_at.len() as u32)
            .filter(|&id| self.kind(id) == KIND_ENUM)
            .any(|id| {
                (0..self.vlen(id) as usize)
                    .any(|i| self.string(self.word(id, 3 + i * 2)) == name.as_bytes())
            })
    }

    /// Where in the BTF blob the offset of `struct name`'s direct member
    /// `member` is stored (tests patch it to prove a wrong offset is caught).
    #[cfg(any(test, feature = "test-support"))]
    pub fn member_offset_position(&self, name: &str, member: &str) -> Option<usize> {
        let id = self.struct_id(name)?;
        self.members(id)
            .find(|m| m.name == member.as_bytes())
            .map(|m| m.offset_at)
    }

    /// Byte offset of `member` in `struct name`, looking through anonymous
    /// unions and structs (`sock.__sk_common` holds `skc_*` inside some).
    #[cfg(any(test, feature = "test-support"))]
    pub fn member_offset(&self, name: &str, member: &str) -> Result<u32> {
        let id = self
            .struct_id(name)
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
        let mut id = self
            .struct_id(name)
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

    #[cfg(any(test, feature = "test-support"))]
    fn find(&self, id: u32, member: &str) -> Option<u32> {
        self.find_with_type(id, member).map(|(bits, _)| bits)
    }

    fn find_with_type(&self, id: u32, member: &str) -> Option<(u32, u32)> {
        for m in self.members(id) {
            if m.name == member.as_bytes() {
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
            // TYPEDEF VOLATILE CONST RESTRICT TYPE_TAG
            if !matches!(self.kind(id), 8..=11 | 18) {
                break;
            }
            id = self.size_or_type(id);
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
        let strings = b"\0int\0outer\0a\0b\0c\0d\0inner\0x\0y\0colour\0RED\0GREEN\0";
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
        // 6: enum colour { RED = 0, GREEN = 1 }
        push(&[
            s("colour"),
            (KIND_ENUM << 24) | 2,
            4,
            s("RED"),
            0,
            s("GREEN"),
            1,
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
    fn finds_enum_values_by_name() {
        let btf = KernelBtf::parse(&blob()).unwrap();
        assert!(btf.has_enum_value("RED"));
        assert!(btf.has_enum_value("GREEN"));
        assert!(!btf.has_enum_value("BLUE"));
        // A member's name is no enum value.
        assert!(!btf.has_enum_value("x"));
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
        // 5.11 and later: the accept probe's walk starts from it.
        assert!(btf.has_enum_value(probes_common::accept::TASK_BTF_HELPER));
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
