//! Kubernetes resource quantities: the bridge's parser, which the kubelet's fit check and
//! the stand-in scheduler share, so the harness and the product never disagree on `500m`.

pub use tandem_bridge::quantity::{QuantityError, milli_to_units, parse_milli};
