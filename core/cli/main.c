#include <stdio.h>
int main(void){puts("stub");return 0;}
