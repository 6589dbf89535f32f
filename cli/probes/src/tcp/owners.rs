//! Who owns each watched listening port, told to the kernel: connections
//! arriving there complete their handshake in softirq, with no owner in
//! sight.

use anyhow::{Context as _, Result};
use aya::{
    Ebpf,
    maps::{HashMap, MapError},
};
use probes_common::sock::{LISTEN_OWNERS_MAP, ListenOwner, listen_key};

use crate::decode;
use stackprobe_model::tcp::sockets::Netns;

/// Tells the kernel who owns a listening port, so connections arriving there
/// (whose handshake completes in softirq) are attributed to it; unless the
/// accept probe found who accepts there, which it keeps.
pub fn set_listen_owner(ebpf: &mut Ebpf, netns: Netns, port: u16, owner: u32) -> Result<()> {
    let key = listen_key(netns.unwrap_or_else(decode::home_netns), port);
    let mut owners = listen_owners(ebpf)?;
    match owners.get(&key, 0) {
        Ok(current) if current.owner == owner || current.accepted != 0 => Ok(()),
        Ok(_) | Err(MapError::KeyNotFound) => {
            let value = ListenOwner { owner, accepted: 0 };
            Ok(owners.insert(key, value, 0)?)
        }
        Err(e) => Err(e.into()),
    }
}

/// Forgets who owns `port` in stackprobe's own namespace.
pub fn forget_listen_owner(ebpf: &mut Ebpf, port: u16) -> Result<()> {
    match listen_owners(ebpf)?.remove(&listen_key(decode::home_netns(), port)) {
        Ok(()) | Err(MapError::KeyNotFound) => Ok(()),
        Err(e) => Err(e.into()),
    }
}

fn listen_owners(ebpf: &mut Ebpf) -> Result<HashMap<&mut aya::maps::MapData, u64, ListenOwner>> {
    let map = ebpf
        .map_mut(LISTEN_OWNERS_MAP)
        .with_context(|| format!("the probes lack {LISTEN_OWNERS_MAP}"))?;
    Ok(HashMap::try_from(map)?)
}
