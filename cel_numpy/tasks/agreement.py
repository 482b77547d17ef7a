"""Subject-verb agreement across an attractor noun (Linzen et al. 2016).

    "The key near the cabinets" -> " is"   (not " are")
    "The authors that the doctor saw" -> " are"

Four subtasks by (subject number, attractor number): SS, SP, PS, PP. In SP and PS the noun
nearest the verb has the wrong number, which is where small models slip.
Scoring ("choice"): " is" vs " are", in that order; correct iff the verb agreeing with the
subject has the higher total log-probability.

The attractor sits in a prepositional phrase ("near the ...") or in an object relative clause
with a past-tense verb that carries no number ("that the ... saw").

Clusters (`Item.cluster`, the independent unit): the subject noun, in both numbers ("key" holds
"The key ..." and "The keys ..."), shared by the four subtasks, so 50 clusters in all.

Template space per subtask: 50 subjects * 49 attractors (never the subject's own noun)
* 12 frames (6 prepositional, 6 relative) = 29400; 588 items per subject and subtask.
"""

from __future__ import annotations

from cel_numpy.tasks.base import Item
from cel_numpy.tasks.template import TemplateTask

NOUNS = (
    ("key", "keys"), ("author", "authors"), ("dog", "dogs"), ("teacher", "teachers"),
    ("picture", "pictures"), ("book", "books"), ("car", "cars"), ("doctor", "doctors"),
    ("box", "boxes"), ("child", "children"), ("woman", "women"), ("man", "men"),
    ("table", "tables"), ("bottle", "bottles"),
    ("student", "students"), ("farmer", "farmers"), ("painting", "paintings"),
    ("letter", "letters"), ("window", "windows"), ("chair", "chairs"), ("lamp", "lamps"),
    ("house", "houses"), ("cat", "cats"), ("horse", "horses"), ("boy", "boys"), ("girl", "girls"),
    ("player", "players"), ("singer", "singers"), ("lawyer", "lawyers"), ("nurse", "nurses"),
    ("pilot", "pilots"), ("officer", "officers"), ("manager", "managers"), ("guard", "guards"),
    ("neighbor", "neighbors"), ("friend", "friends"), ("cup", "cups"), ("plate", "plates"),
    ("door", "doors"), ("flower", "flowers"), ("tree", "trees"), ("statue", "statues"),
    ("wolf", "wolves"), ("knife", "knives"), ("leaf", "leaves"), ("church", "churches"),
    ("dish", "dishes"), ("baby", "babies"), ("city", "cities"), ("lady", "ladies"),
)  # fmt: skip
FRAMES = (
    "near the {}", "behind the {}", "next to the {}", "beside the {}", "with the {}",
    "under the {}",
    "that the {} saw", "that the {} liked", "that the {} found", "that the {} met",
    "that the {} visited", "that the {} described",
)  # fmt: skip
CHOICES = (" is", " are")


class Agreement(TemplateTask):
    name = "agreement"
    scoring = "choice"
    max_new_tokens = 1
    subtasks = ("SS", "SP", "PS", "PP")
    shared_clusters = True  # the subject noun is one unit across the four subtasks

    def space_size(self, subtask: str) -> int:
        return len(NOUNS) * (len(NOUNS) - 1) * len(FRAMES)

    def item_at(self, subtask: str, index: int) -> Item:
        self._check_index(subtask, index)
        index, k = divmod(index, len(NOUNS) * (len(NOUNS) - 1))
        s, a = divmod(k, len(NOUNS) - 1)
        a += a >= s  # skip the subject's own noun
        subject = NOUNS[s][subtask[0] == "P"]
        attractor = NOUNS[a][subtask[1] == "P"]
        prompt = f"The {subject} {FRAMES[index].format(attractor)}"
        return Item(
            self.name,
            subtask,
            prompt,
            answer=CHOICES[subtask[0] == "P"],
            choices=CHOICES,
            cluster=NOUNS[s][0],
        )

    def cluster_shape(self, subtask: str) -> tuple[int, int]:
        return len(NOUNS), (len(NOUNS) - 1) * len(FRAMES)

    def item_in_cluster(self, subtask: str, cluster: int, j: int) -> Item:
        frame, a = divmod(j, len(NOUNS) - 1)
        return self.item_at(
            subtask, frame * len(NOUNS) * (len(NOUNS) - 1) + cluster * (len(NOUNS) - 1) + a
        )
