//! Tandem's node agent: registers resources, launches batch scripts and steps, enforces limits.
