//! What every probe's userspace side uses to set itself up: the values it
//! needs set before load, and loading and attaching its programs.

use anyhow::{Context as _, Result, anyhow, bail};
use aya::{Ebpf, programs::TracePoint};

use super::tracefs::Tracefs;

/// What one probe needs set before load: globals and map sizes.
pub struct Setup {
    pub globals: Vec<(&'static str, u32)>,
    pub map_sizes: Vec<(&'static str, u32)>,
}

/// The program `name` of the object, as its type `T`.
pub fn program<'a, T>(ebpf: &'a mut Ebpf, name: &str) -> Result<&'a mut T>
where
    &'a mut T: TryFrom<&'a mut aya::programs::Program, Error = aya::programs::ProgramError>,
{
    let program = ebpf
        .program_mut(name)
        .ok_or_else(|| anyhow!("the eBPF object lacks {name}"))?;
    Ok(program.try_into()?)
}

/// Loads `program` and attaches it to each `category/event`, saying which
/// hook this kernel lacks if one is missing.
pub fn attach_tracepoints(
    ebpf: &mut Ebpf,
    tracefs: &Tracefs,
    program: &str,
    category: &str,
    events: &[&str],
) -> Result<()> {
    for event in events {
        if !tracefs.has_event(category, event) {
            bail!(
                "this kernel has no tracepoint {category}/{event}, which stackprobe's {program} probe needs"
            );
        }
    }
    let tp: &mut TracePoint = ebpf
        .program_mut(program)
        .with_context(|| format!("the eBPF object has no program {program}"))?
        .try_into()?;
    tp.load()
        .with_context(|| format!("loading {program} (the kernel's verifier refused it)"))?;
    for event in events {
        tp.attach(category, event)
            .with_context(|| format!("attaching {program} to {category}/{event}"))?;
    }
    Ok(())
}
