"""What every task module uses to describe its own labels, beside the Task object (tasks/common.py):
no task of their own here.

    labels.py       labels as given, read from a pool (each task's Task.read_labels is built of them)
    labelstudio.py  the pieces of Label Studio pre-labels and labeling configs (each task's
                    prelabels and control; selection/export.py, coco_yolo.py and report.py use them)
"""
