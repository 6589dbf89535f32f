//! Basic authentication against the web config's bcrypt hashes.
//!
//! bcrypt is slow on purpose (~70 ms a check at cost 10), and Prometheus
//! sends the same credentials at every scrape: a pair that verified once is
//! remembered, so only the first scrape pays. Checks run off the runtime's
//! thread, which also drives the probes, one at a time, so that a client
//! sending wrong passwords costs at most one core.

use std::{
    collections::{BTreeMap, HashMap, HashSet},
    sync::Mutex,
};

use anyhow::{Result, bail};
use base64::Engine as _;

/// A bcrypt hash of a password nobody has ("fakepassword", exporter-toolkit's
/// at cost 10): an unknown user is checked against it, so that the answer
/// takes as long as for a known one and does not tell which users exist.
const NOBODY: &str = "$2y$10$QOauhQNbBCuQDKes6eFzPeMqBSjb7Mr5DUmpZ/VcEd00UAV/LDeSi";

/// Bounds the memory a stream of distinct valid pairs can take (bcrypt
/// reads only a password's first 72 bytes, so a user has endless ones).
const REMEMBERED: usize = 64;

pub struct Users {
    hashes: HashMap<String, String>,
    /// The (user, password) pairs that verified.
    verified: Mutex<HashSet<(String, String)>>,
    checking: tokio::sync::Mutex<()>,
}

impl Users {
    /// The users and their hashes, each hash checked to be bcrypt's.
    pub fn new(users: BTreeMap<String, String>) -> Result<Self> {
        for (user, hash) in &users {
            if user.contains(':') {
                bail!("user `{user}`: a name with ':' can never log in (basic auth splits at it)");
            }
            if let Err(e) = hash.parse::<bcrypt::HashParts>() {
                bail!(
                    "user `{user}`: not a bcrypt hash ({e}); make one with \
                     htpasswd -nBC 10 \"\" | tr -d ':\\n'"
                );
            }
        }
        Ok(Self {
            hashes: users.into_iter().collect(),
            verified: Mutex::default(),
            checking: tokio::sync::Mutex::new(()),
        })
    }

    pub fn count(&self) -> usize {
        self.hashes.len()
    }

    /// Whether the request head carries the credentials of a user.
    pub async fn allow(&self, head: &str) -> bool {
        let Some((user, password)) = credentials(head) else {
            return false;
        };
        let pair = (user, password);
        if self.remembered(&pair) {
            return true;
        }
        let _one_at_a_time = self.checking.lock().await;
        // Its twin may have been checked while this one waited.
        if self.remembered(&pair) {
            return true;
        }
        let known = self.hashes.get(&pair.0);
        let hash = known.map_or(NOBODY, String::as_str).to_owned();
        let password = pair.1.clone();
        let matches = tokio::task::spawn_blocking(move || bcrypt::verify(password, &hash))
            .await
            .is_ok_and(|r| r.unwrap_or(false));
        if !(matches && known.is_some()) {
            return false;
        }
        let mut verified = self.verified.lock().unwrap_or_else(|p| p.into_inner());
        if verified.len() >= REMEMBERED {
            verified.clear();
        }
        verified.insert(pair);
        true
    }

    fn remembered(&self, pair: &(String, String)) -> bool {
        self.verified
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .contains(pair)
    }
}

/// The user and password of the head's `Authorization: Basic` header. Only
/// whole lines before the blank one count: a head cut short by the read
/// buffer is refused, not read from a truncated value.
fn credentials(head: &str) -> Option<(String, String)> {
    let (head, _) = head.split_once("\r\n\r\n")?;
    let value = head.split("\r\n").skip(1).find_map(|line| {
        let (name, value) = line.split_once(':')?;
        name.trim()
            .eq_ignore_ascii_case("authorization")
            .then_some(value.trim())
    })?;
    let (scheme, encoded) = value.split_once(' ')?;
    if !scheme.eq_ignore_ascii_case("basic") {
        return None;
    }
    let decoded = base64::engine::general_purpose::STANDARD
        .decode(encoded.trim())
        .ok()?;
    let (user, password) = String::from_utf8(decoded)
        .ok()?
        .split_once(':')
        .map(|(u, p)| (u.to_owned(), p.to_owned()))?;
    Some((user, password))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::export::prometheus::web_config::tests::hash;

    fn head(authorization: &str) -> String {
        format!("GET /metrics HTTP/1.1\r\nHost: x\r\n{authorization}Accept: */*\r\n\r\n")
    }

    fn basic(user_password: &str) -> String {
        format!(
            "Authorization: Basic {}\r\n",
            base64::engine::general_purpose::STANDARD.encode(user_password)
        )
    }

    #[test]
    fn credentials_come_from_a_whole_basic_header() {
        let pair = |u: &str, p: &str| Some((u.to_owned(), p.to_owned()));
        assert_eq!(credentials(&head(&basic("u:p:q"))), pair("u", "p:q"));
        assert_eq!(
            credentials(&head("authorization: basic dTpw\r\n")),
            pair("u", "p"),
            "names and scheme in any case"
        );
        assert_eq!(credentials(&head(&basic(":"))), pair("", ""));
        for bad in [
            head(""),
            head("Authorization: Bearer dTpw\r\n"),
            head("Authorization: Basic !!!\r\n"),
            head(&basic("no colon")),
            head("Authorization: Basic\r\n"),
            // The request line is no header, and a head without its end
            // may have lost the header's tail.
            "GET /Authorization: Basic dTpw HTTP/1.1\r\n\r\n".to_owned(),
            basic("u:p").trim_end().to_owned(),
        ] {
            assert_eq!(credentials(&bad), None, "{bad:?}");
        }
    }

    #[test]
    fn only_a_users_own_password_is_let_in_and_remembered() {
        let users = Users::new(BTreeMap::from([("u".to_owned(), hash())])).unwrap();
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        runtime.block_on(async {
            for refused in [
                head(""),
                head(&basic("u:wrong")),
                head(&basic("u:")),
                head(&basic("nobody:secret")),
                head(&basic("U:secret")),
            ] {
                assert!(!users.allow(&refused).await, "{refused:?}");
            }
            assert!(
                users.verified.lock().unwrap().is_empty(),
                "failures are not kept"
            );
            assert!(users.allow(&head(&basic("u:secret"))).await);
            assert!(users.remembered(&("u".to_owned(), "secret".to_owned())));
            assert!(users.allow(&head(&basic("u:secret"))).await);
            assert_eq!(users.verified.lock().unwrap().len(), 1);
        });
    }

    #[test]
    fn the_stand_in_hash_is_bcrypts_and_matches_no_empty_password() {
        assert!(NOBODY.parse::<bcrypt::HashParts>().is_ok());
        assert!(!bcrypt::verify("", NOBODY).unwrap());
    }
}
