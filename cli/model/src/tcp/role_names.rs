//! The names of the links' owners' roles, each kept once and referred to
//! by id, with the unused ones let go past a bound.

use rustc_hash::FxHashMap;

/// Role names kept before the unused ones are let go (or twice as many as
/// were in use then, if more).
pub(super) const MAX_ROLE_NAMES: usize = 4096;

/// Role names, each kept once, by id.
#[derive(Clone, Debug, Default)]
pub(super) struct RoleNames {
    ids: FxHashMap<String, u32>,
    pub(super) names: Vec<String>,
    /// In use after the last compaction.
    in_use: usize,
}

impl RoleNames {
    pub(super) fn id(&mut self, role: &str) -> u32 {
        if let Some(&id) = self.ids.get(role) {
            return id;
        }
        let id = self.names.len() as u32;
        self.names.push(role.to_string());
        self.ids.insert(role.to_string(), id);
        id
    }

    pub(super) fn name(&self, id: u32) -> &str {
        &self.names[id as usize]
    }

    /// Whether enough names may be unused to compact them.
    pub(super) fn full(&self) -> bool {
        self.names.len() > MAX_ROLE_NAMES.max(2 * self.in_use)
    }

    /// Keeps only the names `in_use` refer to, renumbering them.
    pub(super) fn compact<'a>(&mut self, in_use: impl Iterator<Item = &'a mut u32>) {
        let old = std::mem::take(self);
        for id in in_use {
            *id = self.id(old.name(*id));
        }
        self.in_use = self.names.len();
    }
}
