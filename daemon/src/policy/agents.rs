//! `agents = ["name" | uid, ...]`: a rule that applies only to the connections of those agent
//! users. AgenShield names an agent's user `ash_<name>_agent`, so a name is that user (a full
//! `ash_…_agent` name is taken as it is); a number is a uid. Names are resolved when the
//! policy loads (an unknown user is an error there, with its position), so deciding compares
//! numbers only. A rule without `agents` applies to every agent; of the rules with them, only
//! a deny applies to a connection whose user is unknown (it may be one of them: fail closed).

use serde::Deserialize;
use toml::Spanned;

use super::error::PolicyError;

/// One entry as written.
#[derive(Debug, Clone, Deserialize)]
#[serde(untagged)]
pub(crate) enum AgentFile {
    Uid(i64),
    Name(String),
}

/// The user an agent name stands for.
pub(crate) fn user_name(name: &str) -> String {
    if name.starts_with("ash_") && name.ends_with("_agent") {
        name.to_string()
    } else {
        format!("ash_{name}_agent")
    }
}

type ErrFn<'a> = dyn Fn(std::ops::Range<usize>, String) -> PolicyError + 'a;

/// The uids, sorted and unique; `None` when the rule has no `agents`.
pub(crate) fn compile_agents(
    list: Option<&Spanned<Vec<Spanned<AgentFile>>>>,
    err: &ErrFn<'_>,
) -> Result<Option<Box<[u32]>>, PolicyError> {
    let Some(list) = list else {
        return Ok(None);
    };
    if list.get_ref().is_empty() {
        return Err(err(
            list.span(),
            "`agents` must not be empty (leave it out to apply to every agent)".into(),
        ));
    }
    let mut uids = Vec::with_capacity(list.get_ref().len());
    for a in list.get_ref() {
        let uid = match a.get_ref() {
            AgentFile::Uid(n) => {
                u32::try_from(*n).map_err(|_| err(a.span(), format!("{n} is not a uid")))?
            }
            AgentFile::Name(name) => resolve(name).map_err(|e| err(a.span(), e.to_string()))?,
        };
        uids.push(uid);
    }
    uids.sort_unstable();
    uids.dedup();
    Ok(Some(uids.into_boxed_slice()))
}

/// Why an agent name does not stand for a user here.
#[derive(Debug, thiserror::Error)]
pub enum AgentError {
    #[error("invalid agent name {0:?}")]
    InvalidName(String),
    #[error(
        "agent {name:?}: no user {user} on this machine (an agent is named for its user \
         ash_<name>_agent, or given as a uid)"
    )]
    NoSuchUser { name: String, user: String },
    #[error("agent {name:?}: looking up user {user}: {source}")]
    Lookup {
        name: String,
        user: String,
        source: nix::Error,
    },
}

/// An agent as given on a command line: a uid, or a name resolved as in a policy.
pub fn agent_uid(given: &str) -> Result<u32, AgentError> {
    match given.parse::<u32>() {
        Ok(uid) => Ok(uid),
        Err(_) => resolve(given),
    }
}

fn resolve(name: &str) -> Result<u32, AgentError> {
    let valid = !name.is_empty()
        && name.len() <= 32
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-');
    if !valid {
        return Err(AgentError::InvalidName(name.to_owned()));
    }
    let user = user_name(name);
    match nix::unistd::User::from_name(&user) {
        Ok(Some(u)) => Ok(u.uid.as_raw()),
        Ok(None) => Err(AgentError::NoSuchUser {
            name: name.to_owned(),
            user,
        }),
        Err(source) => Err(AgentError::Lookup {
            name: name.to_owned(),
            user,
            source,
        }),
    }
}

#[cfg(test)]
#[path = "agents_tests.rs"]
mod tests;
