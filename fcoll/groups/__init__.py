"""Who takes part: `Group`, the world and `init` (`group`), `Mesh` and the meshes active
under ``with mesh:`` (`mesh`, `active_meshes`), `new_subgroups` (`subgroups`), the start of
every public call (`membership.member`: the group argument resolved, its `Call` readied),
the ``debug="detail"`` cross-rank check (`detail`) and `halo_exchange`'s per-axis arguments
on a mesh (`halo_axes`).
"""
