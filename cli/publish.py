"""`evolforge publish --out DIR --repo NAME`: a dataset folder (its card and the tables the card names) to the
Hugging Face Hub, as a dataset repo. The token comes from HF_TOKEN (or `hf auth login`); it is never printed."""

from __future__ import annotations

import os
import sys
from pathlib import Path


def _fail(message: str) -> int:
    print(f"evolforge publish: {message}", file=sys.stderr)
    return 2


def cmd_publish(args) -> int:
    from evolforge.storage.cards import CARD, card_files, card_for_repo, dataset_folders

    out = Path(args.out)
    if not out.is_dir():
        return _fail(f"{out} is not a local folder (publish reads a finished run's folder on this machine)")
    folders = dataset_folders(out)
    if not folders:
        return _fail(f"no dataset card under {out}: run a stage (run, synthesize, reward-data, pipeline) into it first")
    if len(folders) > 1:
        return _fail(f"{out} holds {len(folders)} datasets; publish one at a time with --out set to one of: "
                     + ", ".join(str(f) for f in folders))
    folder = folders[0]
    files = card_files(folder)

    import huggingface_hub
    from huggingface_hub import CommitOperationAdd, HfApi, constants

    token = os.environ.get("HF_TOKEN") or huggingface_hub.get_token()
    if not token:
        return _fail("no Hugging Face token: set HF_TOKEN to a token with write access "
                     "(https://huggingface.co/settings/tokens) or run `hf auth login`")
    endpoint = constants.ENDPOINT
    api = HfApi(token=token)
    try:
        api.create_repo(args.repo, repo_type="dataset", private=args.private or None, exist_ok=True)
        # one commit: the tables the card names and the card, its load example naming the repo
        ops = [CommitOperationAdd(path_in_repo=f, path_or_fileobj=str(folder / f)) for f in files if f != CARD]
        ops.append(CommitOperationAdd(path_in_repo=CARD, path_or_fileobj=card_for_repo(folder, args.repo)))
        commit = api.create_commit(repo_id=args.repo, repo_type="dataset", operations=ops,
                                   commit_message=args.message)
    except Exception as e:  # noqa: BLE001  one clear line, never the token
        detail = f"{type(e).__name__}: {e}".replace(token, "***")
        return _fail(f"could not publish {folder} to {endpoint} as dataset {args.repo!r} ({detail[:500]}). "
                     "Check the network (HF_ENDPOINT), the token's write access and the repo name.")
    print(f"published {folder} ({', '.join(files)}) to {getattr(commit, 'commit_url', None) or args.repo}")
    return 0


def register(sub) -> None:
    p = sub.add_parser("publish", help="push a run's dataset folder (card + tables) to the Hugging Face Hub")
    p.add_argument("--out", required=True, help="a run folder, or the dataset folder inside it (the one with README.md)")
    p.add_argument("--repo", required=True, help="Hub dataset repo id, e.g. your-name/evolved-instructions")
    p.add_argument("--private", action="store_true", help="create the repo private")
    p.add_argument("--message", default="evolforge publish", help="commit message")
    p.set_defaults(fn=cmd_publish)
