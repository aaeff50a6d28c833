"""`veritrain keys`: the signing key pair, kept outside every workspace (veritrain.core.signing_keys)."""

from __future__ import annotations

from typing import Optional

import click

from veritrain.cli.options import json_option, workdir_option
from veritrain.cli.render import emit_json

KEY_HELP = "The private key file (default: $VERITRAIN_SIGNING_KEY, else signing-key.pem in ~/.config/veritrain/)."


@click.group("keys")
def keys_group() -> None:
    """The ECDSA P-256 key pair that signs what veritrain states about runs."""


@keys_group.command("init")
@click.option("--out", "out", type=click.Path(file_okay=False), default=None,
              help="Folder to create the pair in (signing-key.pem and signing-key.pub.pem) instead of the default place.")
@click.option("--key", "key", type=click.Path(dir_okay=False), default=None, help=KEY_HELP)
@workdir_option
@json_option
def keys_init(out: Optional[str], key: Optional[str], workdir: Optional[str], as_json: bool) -> int:
    """Create a new key pair (the private key with mode 0600); an existing key is never replaced.

    \b
    Example:
      veritrain keys init
    """
    from pathlib import Path

    from veritrain.core import signing_keys

    path = Path(out) / signing_keys.KEY_NAME if out else signing_keys.key_path(key)
    public = signing_keys.init(path)
    _report(public, path, as_json, created=True)
    return 0


@keys_group.command("show")
@click.option("--key", "key", type=click.Path(dir_okay=False), default=None, help=KEY_HELP)
@workdir_option
@json_option
def keys_show(key: Optional[str], workdir: Optional[str], as_json: bool) -> int:
    """Print the public key and its fingerprint (the SHA-256 of its DER SubjectPublicKeyInfo).

    \b
    Example:
      veritrain keys show --json
    """
    from veritrain.core import signing_keys

    path = signing_keys.key_path(key)
    _report(signing_keys.show(path), path, as_json, created=False)
    return 0


def _report(public: object, private: object, as_json: bool, created: bool) -> None:
    from veritrain.core.signing_keys import ALGORITHM, PublicKey

    assert isinstance(public, PublicKey)
    if as_json:
        emit_json({"algorithm": ALGORITHM, "fingerprint": public.fingerprint, "public_key": public.pem,
                   "public_key_file": str(public.path), "private_key_file": str(private), "created": created})
        return
    if created:
        click.echo(f"created {private} (private, mode 0600) and {public.path}")
    click.echo(f"fingerprint {public.fingerprint} ({ALGORITHM})")
    click.echo(public.pem.rstrip("\n"))
