//! Integration tests of routelab-sim.
mod calibration;
mod engine;
mod peers;
mod traffic;
mod validation;
