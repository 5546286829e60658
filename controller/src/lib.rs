//! Tandem's batch controller daemon: gRPC API, durable store, scheduling loop, accounting.
