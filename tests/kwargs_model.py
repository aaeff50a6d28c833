"""A user model with keyword arguments whose names merely contain `token` or `key` (`max_tokens`, `key_dim`):
they are ordinary numbers and must be recorded, hashed and passed as given."""

import numpy as np
import torch


def make(input_shape, num_outputs, hidden, max_tokens, key_dim):
    assert isinstance(max_tokens, int) and isinstance(key_dim, int), f"got {max_tokens!r}, {key_dim!r}"
    return torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(int(np.prod(input_shape)), hidden), torch.nn.ReLU(),
                               torch.nn.Linear(hidden, num_outputs))
