//! Integration tests of routelab-sim.
mod calibration;
mod engine;
mod traffic;
mod validation;
