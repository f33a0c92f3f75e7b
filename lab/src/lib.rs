//! # routelab-lab
//!
//! The routing-policy lab: what decides which runs to make and what they mean, on top of the
//! simulator (`routelab-sim`) and written through the output formats (`routelab-reports`):
//!
//! - [`capacity`]: the capacity search on one seed ([`find_capacity`]) and the study across
//!   policies and seeds ([`run_study`], with `--seeds auto`), into `routelab-reports`'
//!   `CapacityStudy`.
//! - [`gate`]: the routing-quality regression gate — the validated suite (it loads the
//!   scenarios), the committed baselines, measuring runs into their shape, the verdicts and the
//!   invariants, into a [`routelab_reports::GateReport`] that the exporters write.
//! - [`shard`] + [`partial`]: sharded runs. [`shard::Shard`] is the one rule that deals units
//!   out; a [`partial::Partial`] holds what a shard's units produced (records, never outputs),
//!   and [`partial::check_set`] checks that a set of partials belongs together;
//!   [`sharded`] is the one path of a whole run, a shard and a merge ([`sharded::run`],
//!   [`sharded::merge`]) over a command's [`sharded::Sharded`] plan.
//! - [`holdout`]: the out-of-sample check of `--holdout` (the in-sample verdict on the held-out
//!   part), into `routelab-reports`' `OutOfSample`.
//! - [`replicas`]: the replicas study ([`replicas::run_replica_study`]): which policies to
//!   follow behind how many gateway replicas, into `routelab-reports`' `ReplicaStudy`.
//! - [`seeds`]: seed growth, `--seeds auto` ([`grow_seeds`]): seeds are added to every
//!   comparison until each reported difference is precise enough; [`seed_of`], the k-th seed
//!   of a study, for every command that runs several seeds.
//!
//! **Does not** format or write outputs itself (tables, CSV, JSON, HTML, charts are
//! `routelab-reports`'), parse command lines or run simulations in parallel (the `routelab`
//! binary does).
#![forbid(unsafe_code)]
#![warn(missing_docs)]

pub mod capacity;
#[cfg(test)]
mod fixture;
pub mod gate;
pub mod holdout;
pub mod partial;
pub mod plan;
pub mod replicas;
pub mod seeds;
pub mod shard;
pub mod sharded;

pub use capacity::{find_capacity, run_study};
pub use gate::{Gate, GateError};
pub use seeds::{grow_seeds, seed_of};
