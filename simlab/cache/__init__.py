"""The prefix cache: nodes, keys, the policy contract, the tree with its bytes and pins, the host tier, the evictor."""
