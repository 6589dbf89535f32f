//! The kernel's per-link counts of opens, closes, aborts and new
//! TIME_WAIT, read and forgotten.

use anyhow::{Context as _, Result};
use aya::{
    Ebpf,
    maps::{MapError, PerCpuHashMap},
};
use probes_common::sock::{
    AF_INET, AF_INET6, LINKS_MAP, LinkCounts, LinkKey, SIDE_ACTIVE, SIDE_PASSIVE,
};

use crate::decode;
use stackprobe_model::tcp::{
    counts::LinkTotals,
    key::{KernelLink, Side},
};

fn links_map(
    ebpf: &mut Ebpf,
) -> Result<PerCpuHashMap<&mut aya::maps::MapData, LinkKey, LinkCounts>> {
    let map = ebpf
        .map_mut(LINKS_MAP)
        .with_context(|| format!("the probes lack {LINKS_MAP}"))?;
    Ok(PerCpuHashMap::try_from(map)?)
}

/// Every link the kernel counts, with its totals since load.
pub fn links(ebpf: &mut Ebpf) -> Result<Vec<(KernelLink, LinkTotals)>> {
    let map = links_map(ebpf)?;
    let mut out = Vec::new();
    for entry in map.iter() {
        let (key, per_cpu) = entry?;
        if let Some(link) = decode::kernel_link(&key) {
            out.push((link, decode::link_totals(per_cpu.iter())));
        }
    }
    Ok(out)
}

/// Removes `owner`'s links from the kernel's map (the self-check's own).
pub fn forget_owner(ebpf: &mut Ebpf, owner: u32) -> Result<()> {
    let mine: Vec<KernelLink> = links(ebpf)?
        .into_iter()
        .filter(|(l, _)| l.owner == owner)
        .map(|(l, _)| l)
        .collect();
    forget_links(ebpf, &mine)
}

/// Removes links from the kernel's map.
pub fn forget_links(ebpf: &mut Ebpf, links: &[KernelLink]) -> Result<()> {
    let mut map = links_map(ebpf)?;
    for link in links {
        match map.remove(&link_key(link)) {
            Ok(()) | Err(MapError::KeyNotFound) => {}
            Err(e) => return Err(e.into()),
        }
    }
    Ok(())
}

/// The kernel's key for `link` (the inverse of decode::kernel_link).
fn link_key(link: &KernelLink) -> LinkKey {
    let bytes = |ip: std::net::IpAddr| match ip {
        std::net::IpAddr::V4(v4) => {
            let mut b = [0u8; 16];
            b[..4].copy_from_slice(&v4.octets());
            b
        }
        std::net::IpAddr::V6(v6) => v6.octets(),
    };
    let p = &link.peer;
    LinkKey {
        owner: link.owner,
        side: match p.side {
            Side::Active => SIDE_ACTIVE,
            Side::Passive => SIDE_PASSIVE,
        },
        _pad: 0,
        family: if p.addr.is_ipv4() { AF_INET } else { AF_INET6 },
        port: p.addr.port(),
        _pad2: 0,
        addr: bytes(p.addr.ip()),
        peer_ip: p.peer_ip.map_or([0; 16], bytes),
        netns: p.netns.unwrap_or_else(decode::home_netns),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_link_key_decodes_back_to_itself() {
        for link in [
            KernelLink {
                owner: 7,
                peer: stackprobe_model::tcp::key::Peer {
                    side: Side::Passive,
                    addr: "[::1]:80".parse().unwrap(),
                    peer_ip: Some("::1".parse().unwrap()),
                    netns: None,
                },
            },
            KernelLink {
                owner: 0,
                peer: stackprobe_model::tcp::key::Peer {
                    side: Side::Active,
                    addr: "10.1.2.3:5432".parse().unwrap(),
                    peer_ip: None,
                    netns: Some(4026532001),
                },
            },
        ] {
            assert_eq!(decode::kernel_link(&link_key(&link)), Some(link));
        }
    }
}
