"""Runtimes: where generation and learning run and how they talk (local threads, or Ray actors)."""


def runtime_for(config):
    """The module whose `train(config, ...)` runs `config`: runtime.ray_runtime or runtime.local."""
    if config.runtime.kind == "ray":
        from softrl.runtime import ray_runtime

        return ray_runtime
    from softrl.runtime import local

    return local
