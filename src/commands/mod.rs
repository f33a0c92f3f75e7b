//! One module per subcommand.
pub mod check;
pub mod policies;
pub mod trace;
pub mod validate;
