"""Train configs of a tiny, randomly initialised embedded CLIP on the mini benchmark: shared by the zero-shot
training tests and the robust CLIP fine-tuning tests."""

from pathlib import Path

from hydra import compose, initialize_config_dir

REPO = Path(__file__).resolve().parents[1]
TINY_CLIP = ["model=openclip_mini", "model.random_init=true", "data.eval_batch_size=128",
             "callbacks.progress_bar.refresh_rate=0"]


def compose_train(tmp_path, mini_dir, *overrides):
    with initialize_config_dir(config_dir=str(REPO / "conf"), version_base="1.3"):
        return compose("train", overrides=[f"run_dir={tmp_path / 'run'}", f"data.source={mini_dir}",
                                           f"paths.data_dir={tmp_path / 'data'}", *TINY_CLIP, *overrides])
