"""A Hugging Face Trainer run, recorded by veritrain with the line marked `# vt`: a tiny BERT, built from its config
(nothing is downloaded), classifies scikit-learn's copy of the UCI digits, each image read as 64 tokens (its pixel
values 0-16).

    pip install 'veritrain[hf]'
    python examples/hf_trainer.py                     # a new run in ./runs/
    python examples/hf_trainer.py --resume runs/<id>/checkpoints/checkpoint-<N>   # continue that run from there
    veritrain verify latest && veritrain check latest

A Trainer run is `bound` (docs/api.md): every byte is verified; reproduce and audit say why they cannot replay it.
"""

import argparse
from pathlib import Path

import numpy as np
import sklearn.datasets
import torch
from transformers import BertConfig, BertForSequenceClassification, Trainer, TrainingArguments

import veritrain as vt  # vt

DIGITS = Path(sklearn.datasets.__file__).parent / "data" / "digits.csv.gz"

parser = argparse.ArgumentParser()
parser.add_argument("--steps", type=int, default=40)
parser.add_argument("--resume", default=None)  # a checkpoint folder of the run to continue
parser.add_argument("--data", default=str(DIGITS))
parser.add_argument("--workdir", default=".")
args = parser.parse_args()


class Digits(torch.utils.data.Dataset):
    def __init__(self, rows: np.ndarray):
        self.tokens = torch.from_numpy(rows[:, :64].astype(np.int64) + 1)  # 0 is padding
        self.labels = torch.from_numpy(rows[:, 64].astype(np.int64))

    def __len__(self):
        return len(self.labels)

    def __getitem__(self, index):
        return {"input_ids": self.tokens[index], "labels": self.labels[index]}


table = np.loadtxt(args.data, delimiter=",")
model = BertForSequenceClassification(BertConfig(vocab_size=18, hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                                                 intermediate_size=64, max_position_embeddings=64, num_labels=10))
training = TrainingArguments(max_steps=args.steps, per_device_train_batch_size=32, learning_rate=1e-3, save_steps=10, logging_steps=5,
                             save_total_limit=2, report_to=[], seed=0, use_cpu=True, disable_tqdm=True)
callback = vt.hf.Callback(inputs=[args.data], name="hf-digits", workdir=args.workdir)  # vt
trainer = Trainer(model=model, args=training, train_dataset=Digits(table), callbacks=[callback])
trainer.train(resume_from_checkpoint=args.resume)
