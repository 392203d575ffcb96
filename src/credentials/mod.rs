//! Credentials: scoped, short-lived AWS credentials for one table, vended
//! through STS `AssumeRole` with a session policy ([`policy`]), or no
//! credentials at all and each storage request signed alone ([`sign`]).

pub(crate) mod policy;
pub(crate) mod sign;
pub(crate) mod vend;

pub use self::policy::AccessMode;
