"""Train configs of a tiny, randomly initialised embedded CLIP on the mini benchmark: shared by the zero-shot
training tests and the robust CLIP fine-tuning tests."""

from helpers import compose_config

TINY_CLIP = ["model=openclip_mini", "model.random_init=true", "data.eval_batch_size=128"]


def compose_train(tmp_path, mini_dir, *overrides):
    return compose_config("train", f"run_dir={tmp_path / 'run'}", f"data.source={mini_dir}",
                          f"paths.data_dir={tmp_path / 'data'}", *TINY_CLIP, *overrides)
