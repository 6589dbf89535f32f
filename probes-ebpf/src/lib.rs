#![no_std]
// The probes are the `stackprobe` binary target (src/main.rs); this empty
// library exists so `cli/probes` can name this crate as a build-dependency and be
// rebuilt when it changes.
