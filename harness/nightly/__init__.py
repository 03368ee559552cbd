"""The nightly regression job and its history: the job itself, change points over the history, the alert policy, the replay of the gates on synthetic histories, and asv marks and results."""
