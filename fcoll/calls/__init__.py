"""A call in flight: its context (`work.Call`: the group's communicator, deadline, name and
call number), the `Work` it returns, polling with deadlines (`work`), what it raises
(`errors`: a mismatch, a missed deadline), and the fingerprint that peers compare before
they move data (`fingerprint`). Transports take a `Call` first.
"""
