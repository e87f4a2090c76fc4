"""tree_cost.py's tree shapes: the root, then equal branches (the first ones a node longer), every node's row
counted once."""

from tree_cost import branches


def test_branches_are_equal_and_cover_the_rows():
    for rows in (1, 2, 5, 16, 33):
        for width in (1, 2, 4, 8):
            tree = branches(rows, width)
            assert len(tree.tokens) == rows
            leaves = tree.leaves()
            depths = sorted(tree.depth(leaf) for leaf in leaves)
            assert len(leaves) == (min(width, rows - 1) or 1)
            assert depths[-1] - depths[0] <= 1 and sum(depths) == rows - 1
