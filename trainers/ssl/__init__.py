from trainers.ssl.trainer import *  # noqa: F403
