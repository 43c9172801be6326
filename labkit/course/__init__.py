"""The course's own helpers, for the lessons in notebooks/.

* labkit.course.profiles: the run a lesson launches (GPU recipe or a CPU run), where the data is;
* labkit.course.exercises: the exercises' checks (a line in JupyterLab; a failure under nbval);
* labkit.course.students: students' copies of the lessons, solutions stripped;
* labkit.course.live: lesson 1.3's live figure, the reward per step of runs in progress;
* labkit.course.incidents: constructed 503 scenarios (made up, labelled so) for exercises;
* labkit.course.paused_run: the two constructed runs with heat pauses (made up, labelled so)
  for exercise 1.3.3.
"""
