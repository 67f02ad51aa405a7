# Drawn by slimkv eval; run `gnuplot plots.gp` in this folder to redraw.
set encoding utf8

reset
set terminal pngcairo size 800,500
set termoption noenhanced
set output "fidelity.png"
set title 'attention output error against the reference'
set xlabel 'layer'
set ylabel 'relative L2 error'
set logscale y
set key outside right
$fidelity1 << EOD
0 0.000000
1 0.000000
2 0.000000
3 0.000000
4 0.000000
5 0.000000
6 0.000000
7 0.000000
EOD
$fidelity2 << EOD
0 0.044239
1 0.009411
2 0.005935
3 0.001485
4 0.046021
5 0.085915
6 0.050302
7 0.021973
EOD
$fidelity3 << EOD
0 0.044332
1 0.009391
2 0.005937
3 0.001478
4 0.045266
5 0.086268
6 0.050008
7 0.021885
EOD
$fidelity4 << EOD
0 0.044637
1 0.008222
2 0.005801
3 0.001305
4 0.037055
5 0.071504
6 0.036301
7 0.020115
EOD
$fidelity5 << EOD
0 0.047922
1 0.010148
2 0.006023
3 0.001767
4 0.067811
5 0.101577
6 0.055596
7 0.023995
EOD
$fidelity6 << EOD
0 0.047924
1 0.010148
2 0.006023
3 0.001767
4 0.067811
5 0.101577
6 0.055596
7 0.023995
EOD
$fidelity7 << EOD
0 0.067665
1 0.024963
2 0.014339
3 0.003192
4 0.081444
5 0.111871
6 0.076297
7 0.037892
EOD
$fidelity8 << EOD
0 0.095747
1 0.056248
2 0.124481
3 0.013060
4 0.111288
5 0.198924
6 0.320386
7 0.189451
EOD
$fidelity9 << EOD
0 0.043957
1 0.009015
2 0.006016
3 0.001496
4 0.055815
5 0.087939
6 0.044969
7 0.021322
EOD
$fidelity10 << EOD
0 0.043123
1 0.008746
2 0.005728
3 0.001371
4 0.040679
5 0.079369
6 0.047004
7 0.020677
EOD
$fidelity11 << EOD
0 0.043081
1 0.008592
2 0.005717
3 0.001324
4 0.039578
5 0.077298
6 0.044756
7 0.019928
EOD
$fidelity12 << EOD
0 0.043290
1 0.008388
2 0.005753
3 0.001290
4 0.038644
5 0.073884
6 0.042962
7 0.019655
EOD
$fidelity13 << EOD
0 0.043179
1 0.008192
2 0.005736
3 0.001279
4 0.037024
5 0.072310
6 0.042189
7 0.019385
EOD
$fidelity14 << EOD
0 0.041201
1 0.007667
2 0.005734
3 0.001221
4 0.033242
5 0.064512
6 0.037630
7 0.018781
EOD
plot $fidelity1 using 1:2 with linespoints title "dense", $fidelity2 using 1:2 with linespoints title "pq:topk=0.2,rerank=1", $fidelity3 using 1:2 with linespoints title "pq:topk=0.2,iters=32,rerank=1", $fidelity4 using 1:2 with linespoints title "pq:topk=0.2,segment=128,rerank=1", $fidelity5 using 1:2 with linespoints title "pq:topk=0.2,segment=512,rerank=1", $fidelity6 using 1:2 with linespoints title "pq:topk=0.2,segment=512,iters=32,rerank=1", $fidelity7 using 1:2 with linespoints title "pq:topk=0.2,segment=1024,rerank=1", $fidelity8 using 1:2 with linespoints title "pq:topk=0.2,segment=4096,rerank=1", $fidelity9 using 1:2 with linespoints title "pq:topk=0.2,m=4,rerank=1", $fidelity10 using 1:2 with linespoints title "pq:topk=0.2,rerank=1.1", $fidelity11 using 1:2 with linespoints title "pq:topk=0.2,rerank=1.15", $fidelity12 using 1:2 with linespoints title "pq:topk=0.2,rerank=1.2", $fidelity13 using 1:2 with linespoints title "pq:topk=0.2,rerank=1.25", $fidelity14 using 1:2 with linespoints title "pq:topk=0.2,rerank=1.5"
unset output
