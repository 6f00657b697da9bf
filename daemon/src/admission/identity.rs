//! Who opened a connection, and what that lets it use. The kernel tells the local uid behind
//! each client socket (`accept::agent_uid`); this file decides on it, failing closed:
//!
//! - **Transparent listener**: agent users only. The firewall redirects nobody else, so
//!   another uid there came by a redirect this daemon did not ask for; it is refused.
//! - **Explicit listener**: agent users, root, the daemon's own user and members of
//!   `agenshield-admin` (the operators: `agenshield proxy exec` keeps working for them), and
//!   whoever `listen.explicit_users` / `listen.explicit_groups` name. Any other local account
//!   (`www-data`, a second login) is refused, so it cannot spend the secrets.
//! - **Secrets**: a rule that binds secrets serves agent users only, unless it names its users
//!   in `agents` (then exactly those uids, an operator's included). Anyone else reaching such
//!   a rule is refused (`secret_not_for_user`); the request never goes out without the secret
//!   either, nor falls through to another rule.
//! - A connection whose owner the OS cannot tell (the client already let go of its socket) is
//!   refused on both listeners (`unknown_user`), never taken for root.
//!
//! Agent users are `redirect.agent_users`, resolved at start: the users the firewall
//! redirects, whether this daemon installs the redirect (`redirect.enabled`) or
//! `agenshield proxy firewall up` does. `testing.every_uid_is_agent` (tests only) takes every
//! local uid for an agent user's; the test-suite connects as whoever runs it.

use crate::record::{ErrorCode, NO_RULE};

/// The operators' group: members may use the explicit listener and the admin socket.
pub const ADMIN_GROUP: &str = "agenshield-admin";

/// Why a user is not served (each a refusal with its error code; see `Refusal`).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum NotAdmitted {
    #[error(
        "the proxy could not tell which local user opened this connection (it was closed \
         already, or it did not come from this host): refused"
    )]
    UnknownUser,
    #[error(
        "{who} is not an agent user (redirect.agent_users): the transparent listener \
         serves agent users only"
    )]
    NotAnAgent { who: String },
    #[error(
        "{who} may not use this proxy: the explicit listener admits agent users, root, \
         members of {ADMIN_GROUP} and the users and groups in listen.explicit_users and \
         listen.explicit_groups"
    )]
    NotExplicit { who: String },
    #[error(
        "rule {} binds secrets, which serve agent users only; {who} is not one, and \
         the rule does not name it in `agents`",
        rule.as_deref().unwrap_or(NO_RULE)
    )]
    SecretNotForUser { who: String, rule: Option<String> },
}

impl NotAdmitted {
    pub(crate) fn code(&self) -> ErrorCode {
        match self {
            NotAdmitted::UnknownUser => ErrorCode::UnknownUser,
            NotAdmitted::NotAnAgent { .. } | NotAdmitted::NotExplicit { .. } => {
                ErrorCode::UserNotAdmitted
            }
            NotAdmitted::SecretNotForUser { .. } => ErrorCode::SecretNotForUser,
        }
    }

    /// The rule whose secrets were refused, for `SecretNotForUser`.
    pub(crate) fn rule(&self) -> Option<&str> {
        match self {
            NotAdmitted::SecretNotForUser { rule, .. } => rule.as_deref(),
            _ => None,
        }
    }
}

/// The users each listener admits, resolved at start.
#[derive(Debug, Clone, Default)]
pub struct Identities {
    /// Sorted.
    pub agents: Vec<u32>,
    pub every_uid_is_agent: bool,
    /// The daemon's own uid (the worker's, in a split daemon).
    pub own_uid: u32,
    /// `agenshield-admin`, where the group exists.
    pub admin_gid: Option<u32>,
    /// `listen.explicit_users` and `listen.explicit_groups`.
    pub explicit_uids: Vec<u32>,
    pub explicit_gids: Vec<u32>,
}

impl Identities {
    /// Whether `uid` is an agent user's.
    pub(crate) fn is_agent(&self, uid: u32) -> bool {
        self.every_uid_is_agent || self.agents.binary_search(&uid).is_ok()
    }

    /// May the owner of a connection on the transparent listener be served?
    pub(crate) fn transparent(&self, uid: Option<u32>) -> Result<(), NotAdmitted> {
        let uid = uid.ok_or(NotAdmitted::UnknownUser)?;
        if self.is_agent(uid) {
            return Ok(());
        }
        Err(NotAdmitted::NotAnAgent { who: shown(uid) })
    }

    /// May the owner of a connection on the explicit listener be served?
    pub(crate) fn explicit(&self, uid: Option<u32>) -> Result<(), NotAdmitted> {
        let uid = uid.ok_or(NotAdmitted::UnknownUser)?;
        if self.is_agent(uid)
            || uid == 0
            || uid == self.own_uid
            || self.explicit_uids.contains(&uid)
            || self.in_admitted_group(uid)
        {
            return Ok(());
        }
        Err(NotAdmitted::NotExplicit { who: shown(uid) })
    }

    /// May the deciding rule's secrets be used for `uid`'s request? `names_agents`: the rule
    /// lists its users in `agents` (so the policy matched it for one of them).
    pub(crate) fn secrets(
        &self,
        uid: Option<u32>,
        names_agents: bool,
        rule: Option<&str>,
    ) -> Result<(), NotAdmitted> {
        if names_agents || uid.is_some_and(|u| self.is_agent(u)) {
            return Ok(());
        }
        let who = uid.map_or_else(|| "an unknown user".to_string(), shown);
        Err(NotAdmitted::SecretNotForUser {
            who,
            rule: rule.map(str::to_string),
        })
    }

    fn in_admitted_group(&self, uid: u32) -> bool {
        let groups = self.admin_gid.iter().chain(&self.explicit_gids);
        let mut groups = groups.peekable();
        if groups.peek().is_none() {
            return false;
        }
        let Ok(Some(user)) = nix::unistd::User::from_uid(nix::unistd::Uid::from_raw(uid)) else {
            return false;
        };
        groups.any(|&gid| {
            user.gid.as_raw() == gid
                || matches!(
                    nix::unistd::Group::from_gid(nix::unistd::Gid::from_raw(gid)),
                    Ok(Some(g)) if g.mem.contains(&user.name)
                )
        })
    }
}

/// `uid 33 (www-data)`, or `uid 33` for a uid with no user.
fn shown(uid: u32) -> String {
    match nix::unistd::User::from_uid(nix::unistd::Uid::from_raw(uid)) {
        Ok(Some(u)) => format!("uid {uid} ({})", u.name),
        _ => format!("uid {uid}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ids() -> Identities {
        Identities {
            agents: vec![5200, 5300],
            every_uid_is_agent: false,
            own_uid: 5201,
            admin_gid: None,
            explicit_uids: vec![1001],
            explicit_gids: vec![],
        }
    }

    #[test]
    fn the_transparent_listener_serves_agent_users_only() {
        let i = ids();
        assert!(i.transparent(Some(5200)).is_ok());
        assert!(i.transparent(Some(5300)).is_ok());
        let code = |r: Result<(), NotAdmitted>| r.expect_err("refused").code();
        assert_eq!(code(i.transparent(Some(0))), ErrorCode::UserNotAdmitted);
        assert_eq!(code(i.transparent(Some(1001))), ErrorCode::UserNotAdmitted);
        assert_eq!(code(i.transparent(None)), ErrorCode::UnknownUser);
        let testing = Identities {
            every_uid_is_agent: true,
            ..ids()
        };
        assert!(testing.transparent(Some(0)).is_ok());
        assert_eq!(code(testing.transparent(None)), ErrorCode::UnknownUser);
    }

    #[test]
    fn the_explicit_listener_serves_agents_operators_and_listed_users() {
        let i = ids();
        for uid in [5200, 0, 5201, 1001] {
            assert!(i.explicit(Some(uid)).is_ok(), "{uid}");
        }
        let r = i.explicit(Some(4242)).expect_err("refused");
        assert_eq!(r.code(), ErrorCode::UserNotAdmitted);
        assert!(r.to_string().contains("uid 4242"), "{r}");
        assert_eq!(
            i.explicit(None).expect_err("refused").code(),
            ErrorCode::UnknownUser
        );
        // A group by primary membership: root's group 0.
        let by_group = Identities {
            explicit_gids: vec![0],
            ..ids()
        };
        let root_group_user = nix::unistd::User::from_name("root")
            .ok()
            .flatten()
            .map(|u| u.gid.as_raw());
        assert_eq!(root_group_user, Some(0));
        assert!(by_group.in_admitted_group(0));
        assert!(!ids().in_admitted_group(0));
    }

    #[test]
    fn secrets_serve_agents_and_the_users_a_rule_names() {
        let i = ids();
        assert!(i.secrets(Some(5200), false, Some("r")).is_ok());
        assert!(
            i.secrets(Some(0), true, Some("r")).is_ok(),
            "named in agents"
        );
        for uid in [Some(0), Some(1001), Some(5201), None] {
            let r = i.secrets(uid, false, Some("r")).expect_err("refused");
            assert_eq!(r.code(), ErrorCode::SecretNotForUser);
            assert_eq!(r.rule(), Some("r"));
        }
    }
}
