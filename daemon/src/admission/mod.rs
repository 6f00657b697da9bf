//! Who may be served, and how much: the users each listener admits (`identity`) and the
//! connections each agent may hold at once (`budget`). Facts about users, not connection
//! code: the accept loops ask them, and the secrets phase asks whose requests a rule's
//! secrets serve.

pub(crate) mod budget;
pub(crate) mod identity;

pub(crate) use budget::{Agent, Budgets, Seat};
pub use identity::ADMIN_GROUP;
pub(crate) use identity::{Identities, NotAdmitted};
