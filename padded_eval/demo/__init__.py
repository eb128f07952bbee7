"""``python -m padded_eval demo``: the digits demo (`digits`) and its TFDS builder (`datasets`)."""

from padded_eval.demo.digits import DESCRIPTION as DESCRIPTION
from padded_eval.demo.digits import PLOT_FILES as PLOT_FILES
from padded_eval.demo.digits import add_arguments as add_arguments
from padded_eval.demo.digits import format_table as format_table
from padded_eval.demo.digits import run as run
