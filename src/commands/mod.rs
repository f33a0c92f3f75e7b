//! One module per subcommand.
pub mod policies;
