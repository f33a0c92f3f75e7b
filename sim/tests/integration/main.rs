//! Integration tests of routelab-sim.
mod calibration;
mod calibration_fit;
mod common_random_numbers;
mod engine;
mod engine_modes;
mod input_traps;
mod knowledge;
mod load_scale;
mod mapped_traces;
mod peers;
mod profiles;
mod queueing;
mod replicas;
mod resample;
mod traffic;
mod validation;
mod weight_error;
