"""Hugging Face hub ids -> local snapshot directories, failing fast when the hub is offline."""

from __future__ import annotations

import os
import re
import urllib.error
import urllib.request

from spec_jax.checkpoints.convert import CheckpointError, HubUnreachableError

# The files a spec_jax load needs; weights other than safetensors are not fetched.
ALLOW_PATTERNS = ('*.json', '*.safetensors', '*.jinja', 'tokenizer*')
_HUB_ID = re.compile(r'[A-Za-z0-9][\w.\-]*/[\w.\-]+')
_TRUE = ('1', 'true', 'yes', 'on')


def looks_like_hub_id(spec: str) -> bool:
    """'org/name' with no path markers (a leading '/', '.', '~' or a file suffix)."""
    return bool(_HUB_ID.fullmatch(spec)) and not spec.endswith(('.gguf', '.safetensors'))


def _offline() -> bool:
    return any(
        os.environ.get(k, '').lower() in _TRUE for k in ('HF_HUB_OFFLINE', 'TRANSFORMERS_OFFLINE')
    )


def hub_reachable(timeout: float = 5.0) -> bool:
    """True when the hub endpoint answers HTTP within `timeout` seconds (any status)."""
    if _offline():
        return False
    endpoint = os.environ.get('HF_ENDPOINT', 'https://huggingface.co').rstrip('/')
    try:
        urllib.request.urlopen(endpoint + '/api/models', timeout=timeout).close()
    except urllib.error.HTTPError:  # An HTTP answer: the hub is there.
        return True
    except (urllib.error.URLError, OSError, ValueError):
        return False
    return True


def snapshot(repo_id: str, timeout: float = 5.0) -> str:
    """The local directory of `repo_id`'s files, from the cache or downloaded.

    Args:
      repo_id: a hub id like 'meta-llama/Llama-3.1-8B-Instruct'.
      timeout: seconds to wait for the hub before declaring it unreachable.

    Raises:
      HubUnreachableError: not cached and the hub cannot be reached (names the id and says a
        local path can be given instead).
      CheckpointError: the hub answered but refused the repository.
    """
    from huggingface_hub import snapshot_download

    try:
        return snapshot_download(
            repo_id, allow_patterns=list(ALLOW_PATTERNS), local_files_only=True
        )
    except Exception:  # Not in the local cache (or incomplete): try the network below.
        pass
    unreachable = HubUnreachableError(
        f'{repo_id!r} is not a local path and the Hugging Face hub is unreachable'
        f'{" (HF_HUB_OFFLINE is set)" if _offline() else ""}; download the model elsewhere '
        f'and pass its local directory (or a .gguf file) instead'
    )
    if not hub_reachable(timeout):
        raise unreachable
    from huggingface_hub.errors import GatedRepoError, RepositoryNotFoundError

    try:
        return snapshot_download(repo_id, allow_patterns=list(ALLOW_PATTERNS), etag_timeout=timeout)
    except (RepositoryNotFoundError, GatedRepoError) as e:
        raise CheckpointError(f'the Hugging Face hub refused {repo_id!r}: {e}') from e
    except Exception as e:
        raise unreachable from e
