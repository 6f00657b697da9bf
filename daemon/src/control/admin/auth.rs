//! Who may use the admin socket, decided on the kernel's peer credentials.

/// Why a peer is not served.
#[derive(Debug, Clone, thiserror::Error)]
pub(crate) enum Refused {
    #[error("uid {0} is an agent user")]
    Agent(u32),
    #[error("uid {0} is neither root nor a member of {group}", group = super::ADMIN_GROUP)]
    NotAdmin(u32),
    #[error("no peer credentials: {0}")]
    NoCredentials(String),
}

/// Root and the daemon's own uid are always served; members of the admin group too; an
/// agent uid never, whatever its groups.
#[derive(Debug, Clone)]
pub(crate) struct AdminAuth {
    pub own_uid: u32,
    pub admin_gid: Option<u32>,
    pub agent_uids: Vec<u32>,
}

impl AdminAuth {
    pub(crate) fn check(&self, uid: u32, gid: u32) -> Result<(), Refused> {
        if self.agent_uids.contains(&uid) {
            return Err(Refused::Agent(uid));
        }
        if uid == 0 || uid == self.own_uid {
            return Ok(());
        }
        if let Some(admin) = self.admin_gid {
            if gid == admin || member_of(uid, admin) {
                return Ok(());
            }
        }
        Err(Refused::NotAdmin(uid))
    }
}

/// Supplementary membership, from the group database (portable to macOS).
fn member_of(uid: u32, gid: u32) -> bool {
    let Ok(Some(user)) = nix::unistd::User::from_uid(nix::unistd::Uid::from_raw(uid)) else {
        return false;
    };
    matches!(
        nix::unistd::Group::from_gid(nix::unistd::Gid::from_raw(gid)),
        Ok(Some(g)) if g.mem.contains(&user.name)
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn agent_is_refused_even_as_root_group_member_and_root_is_served() {
        let auth = AdminAuth {
            own_uid: 5201,
            admin_gid: Some(0),
            agent_uids: vec![5200],
        };
        assert!(auth.check(5200, 0).is_err(), "agent with the admin gid");
        assert!(auth.check(0, 0).is_ok());
        assert!(auth.check(5201, 5201).is_ok(), "the daemon's own uid");
        assert!(auth.check(4242, 4242).is_err());
        assert!(
            auth.check(4242, 0).is_ok(),
            "primary group is the admin group"
        );
    }
}
