"""Grading the lessons: `pytest --nbval-lax notebooks/students/<lesson>.ipynb` fails an unsolved exercise.

In JupyterLab a check cell only prints its verdict, so Run All goes on past an exercise
not solved yet. pytest reads this file before it runs any notebook below notebooks/, and
the kernels nbval starts inherit its environment: with LABKIT_GRADING set, a check cell
whose answer is wrong or missing raises ExerciseError, and nbval fails that cell
(labkit.course.exercises.grading).
"""

import os

os.environ["LABKIT_GRADING"] = "1"
