//! Root only: whole per-CPU hash maps read in batches, against maps the
//! test fills itself, over several batches.

mod support;

use std::collections::BTreeMap;

use aya::maps::{MapData, PerCpuHashMap, PerCpuValues};
use stackprobe_probes::batch;
use support::*;

/// 8 KiB: on 2 CPUs a batch holds 16 keys, so 100 keys take 7 batches.
type Value = [u64; 1024];

fn value(key: u32, cpu: usize) -> Value {
    let mut v = [0u64; 1024];
    for (i, x) in v.iter_mut().enumerate() {
        *x = u64::from(key) << 32 | (cpu as u64) << 16 | i as u64;
    }
    v
}

#[test]
fn every_key_comes_once_with_its_value_on_each_cpu() {
    require_root();
    let cpus = aya::util::nr_cpus().expect("possible CPUs");
    let mut map = PerCpuHashMap::<MapData, u32, Value>::create(256, 0).expect("a per-CPU hash");
    let mut seen = 0;
    batch::for_each(&map, &mut batch::Scratch::default(), |_, _| seen += 1)
        .expect("reading an empty map");
    assert_eq!(seen, 0, "an empty map has nothing to hand out");

    let keys: Vec<u32> = (0..100).map(|k| k * 7 + 3).collect();
    for &k in &keys {
        let values: Vec<Value> = (0..cpus).map(|cpu| value(k, cpu)).collect();
        map.insert(k, PerCpuValues::try_from(values).expect("one per CPU"), 0)
            .expect("insert");
    }
    let mut read: BTreeMap<u32, Vec<Value>> = BTreeMap::new();
    let mut scratch = batch::Scratch::default();
    // Twice with the same buffers: the second read starts over.
    for _ in 0..2 {
        read.clear();
        batch::for_each(&map, &mut scratch, |k, values| {
            assert!(read.insert(k, values.to_vec()).is_none(), "key {k} twice");
        })
        .expect("reading the map");
        assert_eq!(read.keys().copied().collect::<Vec<_>>(), {
            let mut sorted = keys.clone();
            sorted.sort_unstable();
            sorted
        });
        for (&k, values) in &read {
            assert_eq!(values.len(), cpus);
            for (cpu, v) in values.iter().enumerate() {
                assert!(*v == value(k, cpu), "key {k}, CPU {cpu}: another value");
            }
        }
    }
}
