//! Integration tests of routelab-sim.
mod calibration;
mod traffic;
mod engine;
