"""A user model that needs secrets; the secrets test checks they arrive as real values."""

import os

import numpy as np
import torch


def checking_factory(input_shape, num_outputs, hidden, api_key, token):
    assert token == os.environ["VT_CANARY_TOKEN"], "the ${env:...} reference was not read"
    assert api_key == os.environ["VT_EXPECTED_KEY"], "the ${env:...} reference under a credential key was not read"
    return torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(int(np.prod(input_shape)), hidden), torch.nn.ReLU(),
                               torch.nn.Linear(hidden, num_outputs))
