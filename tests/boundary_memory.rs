//! The boundary integration cases (issue 2) against the embedded memory store.

mod support;

boundary_cases!(support::store_yaml(None));
