//! The boundary integration cases against the embedded memory store.

mod support;

boundary_cases!(support::store_yaml(None));
