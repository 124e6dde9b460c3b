"""What a call means, decided before anything is sent: the op tables of MPI and NCCL and
ufuncs as ops (`ops`), wire dtypes and identities (`dtypes`), the argument checks
(`validate`), the reduction plans (`plan`: what travels, which op, how the result is made),
a point-to-point message's header (`header`), and the array types the public signatures
accept (`arrays`). Imports no transport, group or collective.
"""
