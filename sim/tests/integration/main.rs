//! Integration tests of routelab-sim.
mod calibration;
mod engine;
mod load_scale;
mod traffic;
mod validation;
