//! One module per subcommand.
pub mod bench;
pub mod capacity;
pub mod check;
pub mod compare;
pub mod emulate;
pub mod h2h;
pub mod merge;
pub mod policies;
pub mod profile;
pub mod realtime;
pub mod replicas;
pub mod run;
pub mod sweep;
pub mod trace;
pub mod validate;
