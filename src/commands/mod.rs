//! One module per subcommand.
pub mod policies;
pub mod trace;
pub mod validate;
