"""White-box AutoAttack of a model on its dataset's clean test split:
`python attack.py run=outputs/train/<dataset>/<run_name>` (resumable, shardable; see conf/attack.yaml).
Same command as the installed `rgb-attack`."""

from rgb.commands.main import attack_main

if __name__ == "__main__":
    attack_main()
