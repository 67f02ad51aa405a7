# Drawn by slimkv eval; run `gnuplot plots.gp` in this folder to redraw.
set encoding utf8

reset
set terminal pngcairo size 1000,1600
set termoption noenhanced
set output "passkey.png"
set multiplot layout 5,2
set xlabel 'depth (%)'
set ylabel 'length (tokens)'
set cbrange [0:1]
set palette defined (0 '#b2182b', 0.5 '#f7f7f7', 1 '#2166ac')
$passkey1 << EOD
x 0 25 50 75 100
1024 1.000000 1.000000 1.000000 1.000000 1.000000
2048 1.000000 1.000000 1.000000 1.000000 1.000000
3072 1.000000 1.000000 1.000000 1.000000 1.000000
4096 1.000000 1.000000 1.000000 1.000000 1.000000
EOD
set title "dense (question after)"
plot $passkey1 matrix rowheaders columnheaders using 1:2:3 with image notitle, $passkey1 matrix rowheaders columnheaders using 1:2:(sprintf('%.2f',$3)) with labels notitle
$passkey2 << EOD
x 0 25 50 75 100
1024 1.000000 1.000000 1.000000 1.000000 1.000000
2048 1.000000 1.000000 1.000000 1.000000 1.000000
3072 1.000000 1.000000 1.000000 1.000000 1.000000
4096 1.000000 1.000000 1.000000 1.000000 1.000000
EOD
set title "dense (question before)"
plot $passkey2 matrix rowheaders columnheaders using 1:2:3 with image notitle, $passkey2 matrix rowheaders columnheaders using 1:2:(sprintf('%.2f',$3)) with labels notitle
$passkey3 << EOD
x 0 25 50 75 100
1024 1.000000 1.000000 1.000000 1.000000 1.000000
2048 1.000000 1.000000 1.000000 1.000000 1.000000
3072 1.000000 1.000000 1.000000 1.000000 1.000000
4096 1.000000 1.000000 1.000000 1.000000 1.000000
EOD
set title "pq:topk=0.2 (question after)"
plot $passkey3 matrix rowheaders columnheaders using 1:2:3 with image notitle, $passkey3 matrix rowheaders columnheaders using 1:2:(sprintf('%.2f',$3)) with labels notitle
$passkey4 << EOD
x 0 25 50 75 100
1024 1.000000 1.000000 1.000000 1.000000 1.000000
2048 1.000000 1.000000 1.000000 1.000000 1.000000
3072 1.000000 1.000000 1.000000 1.000000 1.000000
4096 1.000000 1.000000 1.000000 1.000000 1.000000
EOD
set title "pq:topk=0.2 (question before)"
plot $passkey4 matrix rowheaders columnheaders using 1:2:3 with image notitle, $passkey4 matrix rowheaders columnheaders using 1:2:(sprintf('%.2f',$3)) with labels notitle
$passkey5 << EOD
x 0 25 50 75 100
1024 1.000000 1.000000 1.000000 1.000000 1.000000
2048 1.000000 1.000000 1.000000 1.000000 1.000000
3072 1.000000 1.000000 1.000000 1.000000 1.000000
4096 1.000000 1.000000 1.000000 1.000000 1.000000
EOD
set title "pq:topk=0.1 (question after)"
plot $passkey5 matrix rowheaders columnheaders using 1:2:3 with image notitle, $passkey5 matrix rowheaders columnheaders using 1:2:(sprintf('%.2f',$3)) with labels notitle
$passkey6 << EOD
x 0 25 50 75 100
1024 1.000000 1.000000 1.000000 1.000000 1.000000
2048 1.000000 1.000000 1.000000 1.000000 1.000000
3072 1.000000 1.000000 1.000000 1.000000 1.000000
4096 1.000000 1.000000 1.000000 1.000000 1.000000
EOD
set title "pq:topk=0.1 (question before)"
plot $passkey6 matrix rowheaders columnheaders using 1:2:3 with image notitle, $passkey6 matrix rowheaders columnheaders using 1:2:(sprintf('%.2f',$3)) with labels notitle
$passkey7 << EOD
x 0 25 50 75 100
1024 1.000000 1.000000 1.000000 1.000000 1.000000
2048 1.000000 1.000000 1.000000 1.000000 1.000000
3072 1.000000 1.000000 1.000000 1.000000 1.000000
4096 1.000000 1.000000 1.000000 1.000000 1.000000
EOD
set title "oracle:topk=0.2 (question after)"
plot $passkey7 matrix rowheaders columnheaders using 1:2:3 with image notitle, $passkey7 matrix rowheaders columnheaders using 1:2:(sprintf('%.2f',$3)) with labels notitle
$passkey8 << EOD
x 0 25 50 75 100
1024 1.000000 1.000000 1.000000 1.000000 1.000000
2048 1.000000 1.000000 1.000000 1.000000 1.000000
3072 1.000000 1.000000 1.000000 1.000000 1.000000
4096 1.000000 1.000000 1.000000 1.000000 1.000000
EOD
set title "oracle:topk=0.2 (question before)"
plot $passkey8 matrix rowheaders columnheaders using 1:2:3 with image notitle, $passkey8 matrix rowheaders columnheaders using 1:2:(sprintf('%.2f',$3)) with labels notitle
$passkey9 << EOD
x 0 25 50 75 100
1024 1.000000 1.000000 1.000000 1.000000 1.000000
2048 1.000000 1.000000 1.000000 1.000000 1.000000
3072 1.000000 1.000000 1.000000 1.000000 1.000000
4096 1.000000 1.000000 1.000000 1.000000 1.000000
EOD
set title "oracle:topk=0.1 (question after)"
plot $passkey9 matrix rowheaders columnheaders using 1:2:3 with image notitle, $passkey9 matrix rowheaders columnheaders using 1:2:(sprintf('%.2f',$3)) with labels notitle
$passkey10 << EOD
x 0 25 50 75 100
1024 1.000000 1.000000 1.000000 1.000000 1.000000
2048 1.000000 1.000000 1.000000 1.000000 1.000000
3072 1.000000 1.000000 1.000000 1.000000 1.000000
4096 1.000000 1.000000 1.000000 1.000000 1.000000
EOD
set title "oracle:topk=0.1 (question before)"
plot $passkey10 matrix rowheaders columnheaders using 1:2:3 with image notitle, $passkey10 matrix rowheaders columnheaders using 1:2:(sprintf('%.2f',$3)) with labels notitle
unset multiplot
unset output

reset
set terminal pngcairo size 1000,420
set termoption noenhanced
set output "kvret.png"
set multiplot layout 1,2
set xlabel 'length (tokens)'
set ylabel 'accuracy'
set yrange [0:1.05]
set key bottom left
set title 'question after'
$kvret1after << EOD
1024 1.000000
2048 1.000000
3072 0.750000
4096 1.000000
EOD
$kvret2after << EOD
1024 0.750000
2048 1.000000
3072 0.750000
4096 1.000000
EOD
$kvret3after << EOD
1024 0.750000
2048 1.000000
3072 0.750000
4096 1.000000
EOD
$kvret4after << EOD
1024 0.750000
2048 1.000000
3072 0.750000
4096 1.000000
EOD
$kvret5after << EOD
1024 0.750000
2048 1.000000
3072 0.750000
4096 1.000000
EOD
plot $kvret1after using 1:2 with linespoints title "dense", $kvret2after using 1:2 with linespoints title "pq:topk=0.2", $kvret3after using 1:2 with linespoints title "pq:topk=0.1", $kvret4after using 1:2 with linespoints title "oracle:topk=0.2", $kvret5after using 1:2 with linespoints title "oracle:topk=0.1"
set title 'question before'
$kvret1before << EOD
1024 1.000000
2048 1.000000
3072 0.750000
4096 0.500000
EOD
$kvret2before << EOD
1024 1.000000
2048 1.000000
3072 0.750000
4096 0.750000
EOD
$kvret3before << EOD
1024 1.000000
2048 1.000000
3072 0.750000
4096 0.750000
EOD
$kvret4before << EOD
1024 1.000000
2048 1.000000
3072 0.750000
4096 0.750000
EOD
$kvret5before << EOD
1024 1.000000
2048 1.000000
3072 0.750000
4096 0.750000
EOD
plot $kvret1before using 1:2 with linespoints title "dense", $kvret2before using 1:2 with linespoints title "pq:topk=0.2", $kvret3before using 1:2 with linespoints title "pq:topk=0.1", $kvret4before using 1:2 with linespoints title "oracle:topk=0.2", $kvret5before using 1:2 with linespoints title "oracle:topk=0.1"
unset multiplot
unset output
