//! The boundary integration cases (issue 2), unchanged, against a real 6-node Redis Cluster.

mod support;

boundary_cases!(support::store_yaml(Some(
    &support::redis_cluster::shared().urls()
)));
