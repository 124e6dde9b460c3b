"""fcoll's collectives inside jitted JAX functions: JAX primitives (`primitives`) with JVP,
transpose and batching rules (`rules`), lowered to a custom call whose handler, written in
Python over XLA's FFI C API (`capi`), runs fcoll's collectives on XLA's buffers
(`handler`; on a GPU, `device`).

Users never import it: `fcoll.lax`'s functions send traced values here (and only then is
JAX imported). docs/jax.md, "Inside jit", says what it does; docs/design.md how.
"""
