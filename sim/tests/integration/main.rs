//! Integration tests of routelab-sim.
mod calibration;
mod common_random_numbers;
mod engine;
mod load_scale;
mod traffic;
mod validation;
