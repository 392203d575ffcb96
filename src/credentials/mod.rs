//! Credentials: scoped, short-lived AWS credentials for one table, vended
//! through STS `AssumeRole` with a session policy ([`policy`]).

pub(crate) mod policy;
pub(crate) mod vend;

pub use self::policy::AccessMode;
