//! joader's shared-memory data plane (see `DESIGN.md`). Work in progress under issue 3.
